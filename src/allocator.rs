//! The process's allocator: mimalloc, entered through its plain `mi_malloc` family whenever
//! the layout asks for no more alignment than those calls give anyway.
//!
//! The `mimalloc` crate's `GlobalAlloc` passes every request to `mi_malloc_aligned`. For a
//! block over 1 KiB that entry point cannot use its small-block fast path and runs its
//! generic aligned path before the ordinary allocation (≈ 75 instructions more by callgrind,
//! several times per proxied request: the request's future, read buffers, response heads),
//! and even its fast path does more than `mi_malloc`'s. `mi_malloc` returns blocks aligned to
//! 16 bytes (`MI_MAX_ALIGN_SIZE`) from 16 bytes up — every size class is a multiple of 16 —
//! and smaller blocks to their size's own alignment, 8; the same rule the standard library's
//! `System` allocator applies to `malloc`. Anything more aligned (the 128-aligned monoio
//! timer entry) still goes to the aligned calls.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment `mi_malloc` gives a block of at least this many bytes.
const PLAIN_ALIGN: usize = 16;

/// mimalloc as the global allocator (`#[global_allocator]` in both binaries).
pub struct Mimalloc;

/// A layout `mi_malloc` serves as it is: its alignment is at most what the block's size
/// class guarantees.
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY (every method): the pointers handed out come from mimalloc and are only ever
// given back to mimalloc (`mi_free` takes blocks from either entry point). The plain calls
// are used only for layouts `plain` accepts, whose alignment the returned block has (see
// the module note); any other layout goes to the aligned calls, which take it as it is.
// A null return (out of memory) is passed on, as `GlobalAlloc` wants.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see above.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see above.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see above; `ptr` came from this allocator.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see above; `ptr` came from this allocator with `layout`.
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_their_alignment_and_keep_their_bytes() {
        let a = Mimalloc;
        for size in [
            1usize, 7, 8, 15, 16, 24, 40, 48, 100, 1000, 1025, 4000, 7144, 70_000,
        ] {
            for align in [1usize, 2, 4, 8, 16, 32, 64, 128] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: a non-zero-size layout; the block is written within its size,
                // grown with the same layout, and freed once.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    p.write_bytes(0xab, size);
                    let q = a.realloc(p, layout, size * 3);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "realloc size {size} align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xab));
                    a.dealloc(q, Layout::from_size_align_unchecked(size * 3, align));
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
