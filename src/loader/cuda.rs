//! The CUDA loader backend (feature `cuda`): training batches staged in pinned host memory
//! and copied to the device asynchronously on a stream of their own.
//!
//! Two sets of staging buffers alternate (double buffering): batch `n+1` is written into
//! one set while the copy of batch `n` still reads the other. A pinned buffer records an
//! event after each copy that reads it, and writing it again first waits for that event,
//! so a buffer is never overwritten while a copy reads it. Device buffers carry cudarc's
//! read/write events, so a trainer using them on its own stream waits for the copy.
//!
//! cudarc panics when libcuda is missing, so [`Uploader::new`] first probes for the library
//! and falls back to host memory with a log line when it, or the device, is not there.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice};

use crate::error::{Error, Result};
use crate::loader::{Storage, Tensor, TrainingBatch};

/// A tensor's values in device memory.
#[derive(Debug, Clone)]
pub struct DeviceBuffer<T>(pub Arc<CudaSlice<T>>);

#[derive(Default)]
struct Staging {
    dense: Option<PinnedHostSlice<f32>>,
    ids: Option<PinnedHostSlice<i64>>,
    labels: Option<PinnedHostSlice<f32>>,
}

/// Copies host training batches to one device.
pub struct Uploader {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    staging: [Staging; 2],
    next: usize,
}

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
        Ok(Uploader {
            ctx,
            stream,
            staging: Default::default(),
            next: 0,
        })
    }

    /// Starts copying `batch`'s tensors to the device and returns it with device storage.
    pub fn upload(&mut self, batch: TrainingBatch) -> Result<TrainingBatch> {
        let staging = &mut self.staging[self.next];
        self.next ^= 1;
        let (ctx, stream) = (&self.ctx, &self.stream);
        let dense = to_device(ctx, stream, &mut staging.dense, &batch.dense)?;
        let ids = to_device(ctx, stream, &mut staging.ids, &batch.ids)?;
        let labels = match &batch.labels {
            Some(l) => Some(to_device(ctx, stream, &mut staging.labels, l)?),
            None => None,
        };
        Ok(TrainingBatch {
            dense,
            ids,
            labels,
            ..batch
        })
    }
}

fn to_device<T>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    slot: &mut Option<PinnedHostSlice<T>>,
    tensor: &Tensor<T>,
) -> Result<Tensor<T>>
where
    T: DeviceRepr + cudarc::driver::ValidAsZeroBits + arrow::datatypes::ArrowNativeType,
{
    let Some(src) = tensor.host() else {
        return Ok(tensor.clone());
    };
    if slot.as_ref().is_none_or(|s| s.len() != src.len()) {
        // SAFETY: the buffer is filled from `src` below before the copy reads it.
        *slot = Some(unsafe { ctx.alloc_pinned::<T>(src.len()) }.map_err(cuda_err)?);
    }
    let pinned = slot.as_mut().expect("allocated above");
    // Waits for the previous copy out of this buffer (double buffering).
    pinned
        .as_mut_slice()
        .map_err(cuda_err)?
        .copy_from_slice(src);
    let device = stream.clone_htod(pinned).map_err(cuda_err)?;
    Ok(Tensor {
        shape: tensor.shape,
        storage: Storage::Device(DeviceBuffer(Arc::new(device))),
    })
}

fn cuda_err(e: cudarc::driver::DriverError) -> Error {
    Error::Dataflow(format!("cuda: {e}"))
}
