"""A small model trained with torchrun and DistributedDataParallel on batches streamed
from `hydrant serve`: each rank pulls its own stream (every rank the same number of
steps, so all-reduce never hangs) and masks the padding rows out of its loss.

    hydrant serve --pipeline examples/criteo.toml --input data/criteo-1000000.parquet \
        --ranks 2 --batch-size 4096 &
    torchrun --nproc-per-node 2 python/examples/torch_ddp.py grpc://127.0.0.1:50051 criteo

Needs `pip install torch` and `pip install -e python`.
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from hydrant_client import TorchDataset


class Model(torch.nn.Module):
    """Dense features through an MLP, ids through one shared embedding table (hashed)."""

    def __init__(self, dense: int, buckets: int = 1 << 18, dim: int = 16):
        super().__init__()
        self.buckets = buckets
        self.embed = torch.nn.EmbeddingBag(buckets, dim, mode="sum")
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dense + dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def forward(self, dense, ids):
        e = self.embed(ids % self.buckets)
        return self.mlp(torch.cat([dense, e], dim=1)).squeeze(1)


def main():
    uri, pipeline = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # RANK and WORLD_SIZE come from torchrun's environment.
    loader = DataLoader(TorchDataset(uri, pipeline), batch_size=None)
    model = None
    for step, batch in enumerate(loader):
        if model is None:
            model = DDP(Model(batch["dense"].shape[1]))
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        logits = model(batch["dense"], batch["ids"])
        keep = (~batch["mask"]).float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, batch["label"], weight=keep, reduction="sum"
        ) / keep.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
