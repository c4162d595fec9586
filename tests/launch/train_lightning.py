"""PyTorch Lightning's default environment under torchrun (no mpi4py, no
MPI launcher) with DDPStrategy(process_group_backend=BACKEND), for the
launcher tests (scripts/launch.sh):

    torchrun --nproc_per_node=N tests/launch/train_lightning.py BACKEND OUT

Rank 0 saves the trained parameters to OUT; the test compares gyre's with
gloo's.
"""
import os
import sys

import torch

backend, out = sys.argv[1], sys.argv[2]
if backend == "gyre":
    import gyre.torch.distributed  # noqa: F401 (registers the backend)
import lightning as L  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

from common import flat_parameters, make_model  # noqa: E402


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


gen = torch.Generator().manual_seed(7)
data = torch.utils.data.TensorDataset(torch.randn(256, 32, generator=gen),
                                      torch.randn(256, 4, generator=gen))
loader = torch.utils.data.DataLoader(data, batch_size=16)  # Lightning adds the sampler
model = Model()
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                    num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
                    strategy=DDPStrategy(process_group_backend=backend),
                    max_epochs=2, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
if trainer.global_rank == 0:
    flat = flat_parameters(model)
    torch.save(flat, out)
    print(f"lightning on {backend}: {trainer.world_size} ranks, |w| = {flat.norm():.6f}",
          flush=True)
