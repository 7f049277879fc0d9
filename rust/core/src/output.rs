//! Output buffers that are written exactly once.
//!
//! Outputs are as large as the batch (tens of MB) and the estimators are memory-bound,
//! so zero-filling a buffer before overwriting it would cost a whole extra pass. An
//! [`OutBuf`] hands out uninitialised per-trajectory slices; every estimator writes every
//! element of its slices (observation tokens included) and only then is the buffer
//! turned into a `Vec`. Debug builds pre-fill a sentinel and check that none survives.

use std::mem::MaybeUninit;

use crate::layout::split_by;

pub(crate) struct OutBuf<T> {
    buf: Vec<T>,
    len: usize,
}

/// Element types with a debug-build sentinel no estimator produces.
pub(crate) trait Sentinel: Copy + Send + Sync {
    const SENTINEL: Self;
    fn is_sentinel(&self) -> bool;
}
impl Sentinel for f32 {
    // A NaN with a payload that arithmetic never yields (compared by bits: NaN != NaN).
    const SENTINEL: Self = f32::from_bits(0x7fa5_a5a5);
    fn is_sentinel(&self) -> bool {
        self.to_bits() == 0x7fa5_a5a5
    }
}
impl Sentinel for f64 {
    const SENTINEL: Self = f64::from_bits(0x7ff5_a5a5_a5a5_a5a5);
    fn is_sentinel(&self) -> bool {
        self.to_bits() == 0x7ff5_a5a5_a5a5_a5a5
    }
}
impl Sentinel for i32 {
    const SENTINEL: Self = i32::MIN + 0x5a5a;
    fn is_sentinel(&self) -> bool {
        *self == Self::SENTINEL
    }
}
impl Sentinel for i64 {
    const SENTINEL: Self = i64::MIN + 0x5a5a;
    fn is_sentinel(&self) -> bool {
        *self == Self::SENTINEL
    }
}

impl<T: Sentinel> OutBuf<T> {
    pub(crate) fn new(len: usize) -> Self {
        let mut buf = Vec::with_capacity(len);
        if cfg!(debug_assertions) {
            buf.resize(len, T::SENTINEL);
            buf.clear();
        }
        Self { buf, len }
    }

    /// The buffer cut at `offsets` (non-decreasing, ending at `len`), one slice per part.
    pub(crate) fn parts<O: Copy + TryInto<usize>>(&mut self, offsets: &[O]) -> Vec<&mut [MaybeUninit<T>]> {
        let len = self.len;
        split_by(&mut self.buf.spare_capacity_mut()[..len], offsets)
    }

    /// The buffer as a `Vec`.
    ///
    /// # Safety
    /// Every element of every slice from `parts` must have been written.
    pub(crate) unsafe fn assume_written(mut self) -> Vec<T> {
        // SAFETY: capacity >= len and the caller guarantees all `len` elements are initialised.
        unsafe { self.buf.set_len(self.len) };
        if cfg!(debug_assertions) {
            assert!(!self.buf.iter().any(T::is_sentinel), "an output element was never written");
        }
        self.buf
    }
}

/// Writes `value` into every element of `dst`.
#[inline]
pub(crate) fn fill<T: Copy>(dst: &mut [MaybeUninit<T>], value: T) {
    for d in dst {
        d.write(value);
    }
}

/// Copies `src` into `dst` (same length).
#[inline]
pub(crate) fn copy_into<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}
