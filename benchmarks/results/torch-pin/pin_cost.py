# One rank, 1 KiB gyre.torch.allreduce_, 7 x 3000 calls: the per-call cost of the way tensors in flight are kept safe
# (GYRE_TORCH_IN_FLIGHT=pin or copy). PYTHONPATH=bindings/python GYRE_TORCH_IN_FLIGHT=pin python3 pin_cost.py
import time, torch, statistics, gyre.torch as hvd
hvd.init()
x = torch.ones(256)
for i in range(2000): hvd.allreduce_(x, name="x")
res=[]
for rep in range(7):
    t0=time.perf_counter()
    for i in range(3000): hvd.allreduce_(x, name="x")
    res.append((time.perf_counter()-t0)/3000*1e6)
from gyre import _gyre
print(_gyre._torch_in_flight_mode(), "median us/call", round(statistics.median(res),2), [round(r,1) for r in res])
