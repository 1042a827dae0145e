"""A small click model trained with torchrun and DistributedDataParallel on batches
streamed from `hydrant serve`: each rank pulls its own stream (every rank the same number
of steps of exactly B rows, so all-reduce never hangs), masks the padding rows out of its
loss, checkpoints every few steps and resumes from the checkpoint's (epoch, step).

    hydrant gen criteo --rows 200000 --out data/criteo-200k.parquet
    hydrant serve --pipeline examples/criteo.toml --input data/criteo-200k.parquet \\
        --ranks 2 --batch-size 1024 --epochs 2 --shuffle &
    torchrun --standalone --nproc-per-node 2 python/examples/torch_ddp.py \\
        grpc://127.0.0.1:50051 criteo --epochs 2 --checkpoint ckpt.pt

Run it again with `--resume` after a crash (or after `--stop-after-step S`, which
checkpoints at step S and exits as a crash would) and it goes on from the next step.
Against a stream (a followed folder or pushed input, one endless epoch 0), `--commit`
commits the step after each checkpoint, so a restarted server delivers from there too
(see spark_streaming.py).
The last line rank 0 prints is a JSON summary that the CI test checks: steps per rank,
the batch sizes seen, each epoch's real row ids (gathered from all ranks) with
`--record-rows`, and the mean loss of the last logged window.

Needs `pip install torch` and `pip install -e python`.
"""
import argparse
import json
import os

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from hydrant_client import Client, TorchDataset


class Model(torch.nn.Module):
    """Dense features through an MLP beside one embedding table per id column (one
    table with per-column offsets: column j's ids live in rows [j·N, (j+1)·N))."""

    def __init__(self, dense: int, columns: int, per_column: int = 1 << 12, dim: int = 16):
        super().__init__()
        self.per_column = per_column
        self.register_buffer("offsets", torch.arange(columns) * per_column)
        self.embed = torch.nn.EmbeddingBag(columns * per_column, dim, mode="sum")
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dense + dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def forward(self, dense, ids):
        e = self.embed(ids % self.per_column + self.offsets)
        return self.mlp(torch.cat([dense, e], dim=1)).squeeze(1)


def widths(uri: str, pipeline: str):
    """The dense and id widths, from the pipeline's schema."""
    dense = columns = 0
    for field in Client(uri).schema(pipeline):
        if pa.types.is_fixed_size_list(field.type):
            if pa.types.is_float32(field.type.value_type):
                dense = field.type.list_size
            elif pa.types.is_int64(field.type.value_type):
                columns = field.type.list_size
    return dense, columns


def save(path: str, model, opt, epoch: int, step: int, job) -> None:
    """Writes the checkpoint atomically: a crash leaves the old one or the new one. It
    keeps the served job, so that a resume at a server serving another job is refused."""
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "epoch": epoch, "step": step, "job": job}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("pipeline")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--checkpoint", default="hydrant-ddp.pt")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="go on from --checkpoint")
    ap.add_argument("--commit", action="store_true",
                    help="commit the step after each checkpoint (streams)")
    ap.add_argument("--stop-after-step", type=int, help="checkpoint at this step and exit")
    ap.add_argument("--record-rows", help="write each epoch's real row ids here (JSON)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dense, columns = widths(args.uri, args.pipeline)
    module = Model(dense, columns)
    opt = torch.optim.Adam(module.parameters(), lr=args.lr)
    start_epoch, start_step, job = 0, 0, None
    if args.resume and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_epoch, start_step = ckpt["epoch"], ckpt["step"] + 1
        job = ckpt.get("job")
        if rank == 0:
            print(f"resuming at epoch {start_epoch} step {start_step}", flush=True)
    model = DDP(module)  # broadcasts rank 0's parameters

    # RANK and WORLD_SIZE come from torchrun's environment.
    data = TorchDataset(
        args.uri, args.pipeline, start_epoch=start_epoch, start_step=start_step, job=job
    )
    loader = DataLoader(data, batch_size=None)
    steps, sizes, rows, window, logged = 0, set(), {}, [], None
    stopped = False
    for epoch in range(start_epoch, args.epochs):
        data.set_epoch(epoch)
        seen = rows.setdefault(epoch, [])
        for batch in loader:
            logits = model(batch["dense"], batch["ids"])
            keep = (~batch["mask"]).float()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, batch["label"], weight=keep, reduction="sum"
            ) / keep.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            steps += 1
            sizes.add(int(batch["dense"].shape[0]))
            seen.extend(batch["row_id"][~batch["mask"]].tolist())
            window.append(loss.item())
            step = batch["step"]
            if len(window) == args.log_every:
                logged, window = sum(window) / len(window), []
                if rank == 0:
                    print(f"epoch {epoch} step {step:4d}  loss {logged:.4f}", flush=True)
            last_of_run = args.stop_after_step is not None and (epoch, step) == (
                start_epoch, args.stop_after_step)
            if rank == 0 and (step % args.checkpoint_every == 0 or last_of_run):
                save(args.checkpoint, model.module, opt, epoch, step, data.job)
                if args.commit:
                    # Saved first: a restart delivers from the step after the checkpoint.
                    Client(args.uri).commit(args.pipeline, step + 1)
            if last_of_run:
                stopped = True
                break
        if stopped:
            # Stopped mid-epoch: the reader has steps read ahead; its stream ends here.
            data.close()
            break
        if rank == 0:
            # The epoch's end: a resume starts the next epoch at step 0.
            save(args.checkpoint, model.module, opt, epoch + 1, -1, data.job)

    everyone = [None] * world
    dist.all_gather_object(everyone, {"steps": steps, "sizes": sorted(sizes), "rows": rows,
                                      "stall_s": data.stall_seconds})
    if rank == 0:
        merged = {}
        for part in everyone:
            for epoch, ids in part["rows"].items():
                merged.setdefault(epoch, []).extend(ids)
        summary = {
            "steps_per_rank": [p["steps"] for p in everyone],
            "batch_sizes": sorted({s for p in everyone for s in p["sizes"]}),
            "rows_per_epoch": {e: len(ids) for e, ids in merged.items()},
            "distinct_rows_per_epoch": {e: int(np.unique(ids).size) for e, ids in merged.items()},
            "stall_s_per_rank": [round(p["stall_s"], 3) for p in everyone],
            "loss_last": logged,
            "stopped": stopped,
        }
        if args.record_rows:
            with open(args.record_rows, "w") as f:
                json.dump({str(e): ids for e, ids in merged.items()}, f)
        print(json.dumps(summary), flush=True)
    # Both ranks leave the process group together: one that tore its side down while the
    # other still wrote its record would cut a connection the other's group still holds.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
