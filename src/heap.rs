//! The process's global allocator: mimalloc, asked for plain blocks whenever a plain block
//! already has the alignment the layout needs.
//!
//! `mimalloc::MiMalloc` passes every layout to `mi_malloc_aligned`. In mimalloc v3 that call
//! takes its fast path only for a block of at most 1 KiB whose free-list head happens to be
//! aligned; any larger block (a request future of a few KiB, an output buffer) goes through
//! `mi_theap_malloc_zero_aligned_at_generic`, which over-allocates by `align - 1` unless the
//! size is a power of two and marks the page as holding interior pointers — about 300
//! instructions instead of about 40, four to five times per proxied request. Every mimalloc
//! block is aligned to the machine word (block sizes are whole words, pages start aligned;
//! `mi_realloc_aligned` relies on the same fact and calls plain `mi_realloc` for such
//! alignments), so a layout aligned to at most a word is served by `mi_malloc` /
//! `mi_zalloc` / `mi_realloc`, and only a larger alignment by the `_aligned` calls. Every
//! block is freed by `mi_free`, which takes either kind.
//!
//! A global allocator is an `unsafe impl` of `GlobalAlloc` by definition, so `unsafe_code`
//! is allowed on that impl (and on the test that drives it), each block with its SAFETY note.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The largest alignment every mimalloc block has: one machine word.
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the module doc).
pub struct Heap;

// SAFETY: every block comes from mimalloc and is returned to it by `mi_free`; a block from
// `mi_malloc`/`mi_zalloc`/`mi_realloc` is word aligned, which covers every layout sent there
// (align <= PLAIN_ALIGN), and the `_aligned` calls honour any other power-of-two alignment.
// A null return (out of memory) is passed on, as `GlobalAlloc` requires.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls into mimalloc with a size and a power-of-two alignment.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract), so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; mimalloc keeps the alignment.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
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

    /// Every size up to 64 KiB past each size class edge, at every alignment from 1 to 4 KiB:
    /// the block is aligned, writable over its whole size, zeroed when asked, keeps its bytes
    /// through a realloc (growing and shrinking), and is freed.
    #[test]
    fn blocks_have_their_alignment_and_keep_their_bytes() {
        let mut sizes: Vec<usize> = (1..=300).collect();
        let mut edge = 256;
        while edge <= 64 * 1024 {
            sizes.extend([
                edge - 9,
                edge - 8,
                edge - 1,
                edge,
                edge + 1,
                edge + 8,
                edge * 5 / 4,
            ]);
            edge *= 2;
        }
        let heap = Heap;
        for &size in &sizes {
            let mut align = 1;
            while align <= 4096 {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // SAFETY: non-zero size; each block is used within its layout and freed once.
                unsafe {
                    let p = heap.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    for i in 0..size {
                        p.add(i).write(i as u8);
                    }
                    let grown = size * 3 + 5;
                    let q = heap.realloc(p, layout, grown);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "realloc size {size} align {align}");
                    for i in 0..size {
                        assert_eq!(q.add(i).read(), i as u8);
                    }
                    let shrunk = size.div_ceil(2);
                    let r = heap.realloc(
                        q,
                        Layout::from_size_align(grown, align).expect("layout"),
                        shrunk,
                    );
                    assert_eq!(r as usize % align, 0, "shrink size {size} align {align}");
                    for i in 0..shrunk {
                        assert_eq!(r.add(i).read(), i as u8);
                    }
                    heap.dealloc(r, Layout::from_size_align(shrunk, align).expect("layout"));

                    let z = heap.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0, "zeroed size {size} align {align}");
                    assert!((0..size).all(|i| z.add(i).read() == 0));
                    heap.dealloc(z, layout);
                }
                align *= 2;
            }
        }
    }
}
