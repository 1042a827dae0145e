//! The CUDA loader backend (feature `cuda`): training batches staged in pinned host memory
//! and copied to the device asynchronously on a stream of their own.
//!
//! Two sets of staging buffers alternate (double buffering): batch `n+1` is written into
//! one set while the copy of batch `n` still reads the other. A pinned buffer records an
//! event after each copy that reads it, and writing it again first waits for that event,
//! so a buffer is never overwritten while a copy reads it. Buffers only grow: a shorter
//! batch (an epoch's last) uses a prefix, since pinning memory costs far more than
//! copying it. Device buffers carry cudarc's read/write events, so a trainer using them on
//! its own stream waits for the copy.
//!
//! Two measured choices (H100, `scripts/gpu-check`'s throughput test):
//! - the staging buffers are plain page-locked memory, not cudarc's default write-combined
//!   kind: DMA out of write-combined memory ran at 7.8 GB/s there against 46.9 GB/s;
//! - batches are copied into them by a pool of threads ([`CopyPool`]) with streaming
//!   stores: one thread's memcpy into pinned memory ran at 9.2 GB/s, sixteen at 43 GB/s,
//!   and the DMA itself at ~47–55 GB/s; the loader's steady rate had a median of 0.75×
//!   a bare pinned copy's over 11 runs (0.62–0.85×). On two H200 machines it was
//!   0.75–0.86× over 15 runs (median 0.83×, 41–48 GB/s against 55 GB/s).
//!
//! cudarc panics when libcuda is missing, so [`Uploader::new`] first probes for the library
//! and falls back to host memory with a log line when it, or the device, is not there.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr, HostSlice, PinnedHostSlice,
    SyncOnDrop, ValidAsZeroBits,
};

use crate::error::{Error, Result};
use crate::loader::copy::CopyPool;
use crate::loader::{Storage, Tensor, TrainingBatch};

/// A tensor's values in device memory.
#[derive(Debug, Clone)]
pub struct DeviceBuffer<T>(pub Arc<CudaSlice<T>>);

#[derive(Default)]
struct Staging {
    dense: Option<Pinned<f32>>,
    ids: Option<Pinned<i64>>,
    labels: Option<Pinned<f32>>,
}

/// A page-locked staging buffer and the event recorded after the last copy out of it.
struct Pinned<T> {
    values: PinnedHostSlice<T>,
    copied: CudaEvent,
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        // The memory is freed next: no copy may still be reading it.
        if let Err(e) = self.copied.synchronize() {
            hydrant_operators::log_line!(
                "hydrant: cuda: waiting for a staging copy before freeing it: {e}"
            );
        }
    }
}

/// The filled prefix of a [`Pinned`] buffer, as cudarc's copies take it. The buffer's own
/// event, not this, orders the copy with later writes (see [`send`]).
struct Prefix<'a, T>(&'a mut [T]);

impl<T> HostSlice<T> for Prefix<'_, T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        _stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        (self.0, SyncOnDrop::Sync(None))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        _stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        (self.0, SyncOnDrop::Sync(None))
    }
}

/// Copies host training batches to one device (what a loader with the cuda backend does
/// with each batch).
pub struct Uploader {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    staging: [Staging; 2],
    next: usize,
    copies: CopyPool,
}

/// The most threads one uploader copies with (there is one uploader per rank).
const MAX_COPY_THREADS: usize = 16;

impl Uploader {
    /// An uploader for device `ordinal`, or why there cannot be one (no CUDA driver on
    /// this machine, no such device).
    pub fn new(ordinal: usize) -> std::result::Result<Self, String> {
        // SAFETY: only tries to dlopen the driver library by its known names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("no CUDA driver (libcuda) found".into());
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| format!("CUDA device {ordinal} unavailable ({e})"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| format!("CUDA device {ordinal}: no stream ({e})"))?;
        let threads =
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_COPY_THREADS));
        Ok(Uploader {
            ctx,
            stream,
            staging: Default::default(),
            next: 0,
            copies: CopyPool::new(threads),
        })
    }

    /// The device's stream the copies run on; synchronize it to wait for every upload.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Starts copying `batch`'s tensors to the device and returns it with device storage.
    pub fn upload(&mut self, batch: TrainingBatch) -> Result<TrainingBatch> {
        let staging = &mut self.staging[self.next];
        self.next ^= 1;
        let (ctx, stream) = (&self.ctx, &self.stream);
        let labels = batch.labels.as_ref();
        let mut dense = reserve(ctx, &mut staging.dense, batch.dense.host())?;
        let mut ids = reserve(ctx, &mut staging.ids, batch.ids.host())?;
        let mut label = reserve(ctx, &mut staging.labels, labels.and_then(|l| l.host()))?;
        // The whole batch in one round of the copy threads.
        let mut pieces = Vec::with_capacity(3);
        pieces.extend(dense.as_mut().map(Fill::bytes));
        pieces.extend(ids.as_mut().map(Fill::bytes));
        pieces.extend(label.as_mut().map(Fill::bytes));
        self.copies.copy(&mut pieces);
        drop(pieces);
        Ok(TrainingBatch {
            dense: send(stream, dense, &batch.dense)?,
            ids: send(stream, ids, &batch.ids)?,
            labels: match labels {
                Some(l) => Some(send(stream, label, l)?),
                None => None,
            },
            ..batch
        })
    }
}

/// A staging buffer made ready for one tensor's host values: its prefix of their length
/// and its event.
struct Fill<'a, T> {
    dst: &'a mut [T],
    copied: &'a CudaEvent,
    src: &'a [T],
}

impl<T: DeviceRepr> Fill<'_, T> {
    /// The (destination, source) bytes of the fill.
    fn bytes(&mut self) -> (&mut [u8], &[u8]) {
        let dst = &mut *self.dst;
        let size = std::mem::size_of_val(self.src);
        // SAFETY: both slices hold `src.len()` plain values (f32, i64: DeviceRepr, no
        // padding, no invalid bit patterns), viewed as their `size` bytes for a memcpy.
        unsafe {
            (
                std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), size),
                std::slice::from_raw_parts(self.src.as_ptr().cast::<u8>(), size),
            )
        }
    }
}

/// Makes `slot` hold at least `src`'s length and waits for the last copy out of it; `None`
/// for a tensor not in host memory.
fn reserve<'a, T: DeviceRepr + ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    slot: &'a mut Option<Pinned<T>>,
    src: Option<&'a [T]>,
) -> Result<Option<Fill<'a, T>>> {
    let Some(src) = src else { return Ok(None) };
    if slot.as_ref().is_none_or(|s| s.values.len() < src.len()) {
        *slot = None; // waits for the old buffer's last copy, then frees it
        // SAFETY: only the prefix filled from a tensor is ever copied out. Flags 0: plain
        // page-locked memory (see the module's docs on write-combined memory).
        let values = unsafe { ctx.alloc_pinned_with_flags::<T>(src.len(), 0) };
        let copied = ctx.new_event(None).map_err(cuda_err)?;
        *slot = Some(Pinned {
            values: values.map_err(cuda_err)?,
            copied,
        });
    }
    let pinned = slot.as_mut().expect("allocated above");
    // Double buffering: the previous copy out of this buffer must have finished.
    pinned.copied.synchronize().map_err(cuda_err)?;
    let dst = &mut pinned.values.as_mut_slice().map_err(cuda_err)?[..src.len()];
    let copied = &pinned.copied;
    Ok(Some(Fill { dst, copied, src }))
}

/// Queues the copy of a filled staging buffer to new device memory; a tensor that was not
/// in host memory is returned as it is.
fn send<T: DeviceRepr + arrow::datatypes::ArrowNativeType>(
    stream: &Arc<CudaStream>,
    fill: Option<Fill<'_, T>>,
    tensor: &Tensor<T>,
) -> Result<Tensor<T>> {
    let Some(Fill { dst, copied, src }) = fill else {
        return Ok(tensor.clone());
    };
    // SAFETY: the copy queued next on the same stream writes every value before any
    // work reads them; work on other streams waits on the slice's write event.
    let mut device = unsafe { stream.alloc::<T>(src.len()) }.map_err(cuda_err)?;
    stream
        .memcpy_htod(&Prefix(dst), &mut device)
        .map_err(cuda_err)?;
    copied.record(stream).map_err(cuda_err)?;
    Ok(Tensor {
        shape: tensor.shape,
        storage: Storage::Device(DeviceBuffer(Arc::new(device))),
    })
}

fn cuda_err(e: cudarc::driver::DriverError) -> Error {
    Error::Dataflow(format!("cuda: {e}"))
}
