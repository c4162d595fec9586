import time, torch
import gyre.torch as hvd
hvd.init()
t = torch.ones(33 * 1024 * 1024 // 4)
s = time.perf_counter(); c = time.process_time()
for _ in range(150): hvd.allreduce_(t, op=hvd.Sum)
print(f"per call: wall {1e3*(time.perf_counter()-s)/150:.2f} ms, cpu {1e3*(time.process_time()-c)/150:.2f} ms")
