//! The extension's allocator: mimalloc, tuned to keep freed pages.
//!
//! Output buffers are tens of MB and written once; with the system allocator each call
//! maps fresh pages and pays a page fault per 4 KiB (microseconds each on a VM), which
//! costs more than the estimators' arithmetic. mimalloc keeps freed pages for reuse.
//! numpy frees our arrays through this same allocator (the Vec is dropped in Rust).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v3; the crate does not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed pages for 10 s (jemalloc's default decay) instead of mimalloc's 1 s before
/// returning them to the OS. Outputs are tens of MB: a call whose predecessor's outputs
/// were freed more than a second ago took fresh pages and paid their faults and zeroing
/// (after 1.5 s idle, 3.36M tokens: GAE median 8.9 -> 5.3 ms, MAE 11.6 -> 10.5 ms, faults
/// per call 220 -> 28 and 508 -> 69). The price: up to 10 s of freed memory stays resident.
pub fn keep_freed_pages() {
    // SAFETY: sets a documented option; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}
