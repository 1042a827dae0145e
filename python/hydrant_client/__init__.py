"""hydrant-client: read a data-parallel rank's training batches from ``hydrant serve``.

    >>> from hydrant_client import Client
    >>> client = Client("grpc://127.0.0.1:50051")                     # doctest: +SKIP
    >>> for batch in client.batches("criteo", rank=0, world_size=2):  # doctest: +SKIP
    ...     loss = model(batch.dense, batch.ids)[~batch.mask]

One ``Batch`` per step, exactly ``B`` rows, read two steps ahead on a background thread.
``batch.dense`` is a ``[B, D]`` float32 and ``batch.ids`` a ``[B, K]`` int64 NumPy array,
writable views of the Arrow buffers received (no copy); ``batch.mask`` is True for
padding rows, which a trainer leaves out of its loss. With PyTorch, ``TorchDataset``
yields dicts of tensors over many epochs (``set_epoch``), on a CUDA device if asked.
"""

from .batch import Batch, HydrantError, PushError
from .client import Client
from .reader import RankReader
from .torch_data import CudaStaging, TorchDataset

__all__ = ["Batch", "Client", "CudaStaging", "HydrantError", "PushError", "RankReader", "TorchDataset"]
