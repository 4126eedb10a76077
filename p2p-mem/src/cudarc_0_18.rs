//! cudarc 0.18's safe types, used directly (feature `cudarc-0-18`; candle 0.10 uses cudarc 0.18):
//! [`device`] for a `CudaContext`, [`stream`] for a [`Stream`](crate::Stream) that borrows a
//! `CudaStream`, and zero-copy [`view`]s and [`view_mut`]s of `CudaSlice` / `CudaView` /
//! `CudaViewMut` that every p2p copy and collective accepts. The same functions, under the
//! same rules, as [`cudarc_interop`](crate::cudarc_interop) for cudarc 0.19 (which also has
//! them as `Device::from_cudarc` and `Stream::from_cudarc`).
//!
//! As for 0.19, p2p leaves the CUDA version and the linking to the application's own cudarc
//! dependency (or candle's): cudarc's build script asks for them if nobody chose.
//!
//! ```no_run
//! use cudarc_0_18::driver::CudaContext; // the application's cudarc 0.18: `cudarc::driver`
//! use p2p_mem::cudarc_0_18::{device, stream, view_mut};
//!
//! let ctx = CudaContext::new(0)?;
//! let cu_stream = ctx.new_stream()?;
//! let mut y = cu_stream.alloc_zeros::<f32>(3)?;
//! let dev = device(&ctx)?;
//! let s = stream(&dev, &cu_stream)?;
//! let view = view_mut(&s, &mut y)?; // hand it to any p2p call on `s`
//! # drop(view);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

crate::cudarc_views::interop!(cudarc_0_18);
