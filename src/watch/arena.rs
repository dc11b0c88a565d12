//! The video store's references, packed: every record's category and tag
//! symbols live in spans of one paged arena, addressed by a `u32` offset,
//! instead of a boxed slice per record. A boxed slice costs its 16-byte
//! fat pointer in the record and a heap allocation rounded up to its size
//! class; a span costs its symbols and a 4-byte offset.
//!
//! Pages are fixed (64 Ki symbols), so the arena grows without copying
//! what it holds (a doubling vector would hold two copies at once, its
//! peak at the worst moment: the load). A released span is kept on a
//! free list of its length and reused by the next span of that length: a
//! catalogue's videos carry a few to a few dozen references, so the
//! lengths recur and the lists stay short.
//!
//! Like the store's handles, a span released by a batch is not reused
//! before the batch is committed, and the spans a batch took are released
//! when it is taken back: records restored by [`Videos::undo`] point at
//! their old spans, which must still hold what they held.
//!
//! [`Videos::undo`]: super::videos::Videos::undo

use crate::model::compact::Sym;

const PAGE_BITS: u32 = 16;
const PAGE: usize = 1 << PAGE_BITS;
const IN_PAGE: u32 = (PAGE as u32) - 1;

/// The longest span: a record counts up to 255 categories and 255 tags
/// (longer lists are kept aside by the store). A span never crosses a
/// page.
const MAX_SPAN: usize = 2 * u8::MAX as usize;

/// Entries the lists of a batch's spans keep room for after a commit.
const BATCH_ROOM: usize = 4096;

/// A span: its offset and its length.
type Span = (u32, u16);

/// Makes room for one more element in a vector of the per-video state
/// that a load sized exactly: a sixteenth more, not double. Doubling
/// would leave up to half of every such vector unused after the first
/// changes (each scope's members on its first upload), a footprint that
/// grows with the catalogue and not the change. The extra copy a
/// sixteenth costs (sixteen moves per element pushed, amortized) is
/// small beside what an insert into a sorted scope already moves.
pub(super) fn make_room<T>(items: &mut Vec<T>) {
    if items.len() == items.capacity() {
        items.reserve_exact((items.len() / 16).max(4));
    }
}

/// A vector of fixed pages ([`PAGE`] elements each): it grows a page at a
/// time and never moves what it holds. The store's records live in one.
/// A `Vec` of 2M records (56 MiB) would copy itself whole when full,
/// holding both copies at that moment, and keep up to half of its
/// capacity unused after.
#[derive(Debug, Clone, Default)]
pub struct Paged<T> {
    pages: Vec<Box<[T]>>,
    len: usize,
}

impl<T: Copy + Default> Paged<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, at: usize) -> Option<&T> {
        (at < self.len).then(|| &self.pages[at >> PAGE_BITS][at & IN_PAGE as usize])
    }

    pub fn push(&mut self, item: T) {
        let at = self.len & IN_PAGE as usize;
        if at == 0 {
            // Filled at once: at most one page is held unused.
            self.pages.push(vec![T::default(); PAGE].into_boxed_slice());
        }
        self.pages[self.len >> PAGE_BITS][at] = item;
        self.len += 1;
    }

    /// Bytes its pages take.
    pub fn footprint(&self) -> usize {
        self.pages.len() * PAGE * size_of::<T>() + self.pages.capacity() * size_of::<Box<[T]>>()
    }
}

impl<T: Copy + Default> std::ops::Index<usize> for Paged<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        self.get(at).expect("an index within the pages")
    }
}

impl<T: Copy + Default> std::ops::IndexMut<usize> for Paged<T> {
    fn index_mut(&mut self, at: usize) -> &mut T {
        assert!(at < self.len, "an index within the pages");
        &mut self.pages[at >> PAGE_BITS][at & IN_PAGE as usize]
    }
}

#[derive(Debug, Default)]
pub struct Arena {
    pages: Vec<Box<[Sym]>>,
    /// The first offset never handed out.
    top: u32,
    /// Reusable spans by length.
    free: Vec<Vec<u32>>,
    /// Released since the last commit (not reusable before it).
    released: Vec<Span>,
    /// Taken since the last commit (released if the batch is undone).
    taken: Vec<Span>,
    /// Symbols in spans handed out and not released.
    held: usize,
}

impl Arena {
    /// The symbols of a span.
    pub fn get(&self, at: u32, len: usize) -> &[Sym] {
        if len == 0 {
            return &[];
        }
        let start = (at & IN_PAGE) as usize;
        &self.pages[(at >> PAGE_BITS) as usize][start..start + len]
    }

    /// Copies symbols into a span of their length: its offset.
    pub fn put(&mut self, syms: &[Sym]) -> u32 {
        let len = syms.len();
        assert!(len <= MAX_SPAN, "a span holds at most {MAX_SPAN} references");
        if len == 0 {
            return 0;
        }
        let at = match self.free.get_mut(len).and_then(Vec::pop) {
            Some(at) => at,
            None => self.grow(len),
        };
        let start = (at & IN_PAGE) as usize;
        self.pages[(at >> PAGE_BITS) as usize][start..start + len].copy_from_slice(syms);
        self.taken.push((at, len as u16));
        self.held += len;
        at
    }

    /// A fresh span at the top, on a new page when the current one
    /// cannot hold it whole (the rest of that page stays unused: at most
    /// one span's worth a page).
    fn grow(&mut self, len: usize) -> u32 {
        let in_page = (self.top & IN_PAGE) as usize;
        if in_page + len > PAGE {
            self.top += (PAGE - in_page) as u32;
        }
        if (self.top >> PAGE_BITS) as usize == self.pages.len() {
            self.pages.push(vec![0; PAGE].into_boxed_slice());
        }
        let at = self.top;
        self.top = self.top.checked_add(len as u32).expect("fewer than 4 billion references held");
        at
    }

    /// Gives a span back: reusable once the batch is committed.
    pub fn release(&mut self, at: u32, len: usize) {
        if len > 0 {
            self.released.push((at, len as u16));
            self.held -= len;
        }
    }

    /// Keeps a batch: the spans it released may be reused.
    pub fn commit(&mut self) {
        self.taken.clear();
        let mut released = std::mem::take(&mut self.released);
        for (at, len) in released.drain(..) {
            self.free_span(at, len);
        }
        self.released = released;
        // An unusually large batch does not leave its lists' room behind.
        self.taken.shrink_to(BATCH_ROOM);
        self.released.shrink_to(BATCH_ROOM);
    }

    /// Takes a batch back: the spans it released hold their records'
    /// symbols again, the ones it took are free.
    pub fn undo(&mut self) {
        for &(_, len) in &self.released {
            self.held += len as usize;
        }
        self.released.clear();
        for (at, len) in std::mem::take(&mut self.taken) {
            self.free_span(at, len);
            self.held -= len as usize;
        }
    }

    fn free_span(&mut self, at: u32, len: u16) {
        let len = len as usize;
        if self.free.len() <= len {
            self.free.resize_with(len + 1, Vec::new);
        }
        self.free[len].push(at);
    }

    /// About how many bytes the arena holds: its pages as far as they
    /// were written, and its lists.
    pub fn footprint(&self) -> usize {
        let lists: usize = self.free.iter().map(|l| l.capacity() * 4).sum();
        self.top as usize * size_of::<Sym>() + lists + (self.released.capacity() + self.taken.capacity()) * 8
    }

    /// Symbols in spans that are held.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_vector_grows_by_a_sixteenth() {
        let mut v: Vec<u32> = Vec::with_capacity(1_600);
        v.extend(0..1_600);
        make_room(&mut v);
        assert_eq!(v.capacity(), 1_700);
        // Room left: nothing moves.
        let at = v.as_ptr();
        make_room(&mut v);
        assert_eq!((v.capacity(), v.as_ptr()), (1_700, at));
        // A small or empty one gets a few.
        let mut empty: Vec<u32> = Vec::new();
        make_room(&mut empty);
        assert_eq!(empty.capacity(), 4);
        // Pushed a hundred thousand times, never more than a sixteenth
        // (plus the few) unused.
        let mut grown: Vec<u32> = Vec::new();
        for i in 0..100_000 {
            make_room(&mut grown);
            grown.push(i);
            assert!(grown.capacity() <= grown.len() + grown.len() / 16 + 4, "{} for {}", grown.capacity(), grown.len());
        }
    }

    #[test]
    fn paged_elements_stay_where_they_were_put() {
        let mut p: Paged<u64> = Paged::default();
        assert_eq!((p.len(), p.get(0), p.footprint()), (0, None, 0));
        p.push(7);
        let first: *const u64 = &p[0];
        for i in 1..(2 * PAGE as u64 + 5) {
            p.push(i * 3);
        }
        assert_eq!(p.len(), 2 * PAGE + 5);
        // Three pages, and the first element never moved.
        assert_eq!(std::ptr::addr_of!(p[0]), first);
        assert!(p.footprint() >= 3 * PAGE * 8);
        assert_eq!((p[0], p[PAGE], p[2 * PAGE + 4]), (7, PAGE as u64 * 3, (2 * PAGE as u64 + 4) * 3));
        p[PAGE] = 1;
        assert_eq!((p.get(PAGE), p.get(2 * PAGE + 5)), (Some(&1), None));
    }

    #[test]
    fn spans_hold_their_symbols_across_pages() {
        let mut a = Arena::default();
        let spans: Vec<(u32, Vec<Sym>)> = (0..20_000u32)
            .map(|i| {
                let syms: Vec<Sym> = (0..(i % 13)).map(|s| i * 16 + s).collect();
                (a.put(&syms), syms)
            })
            .collect();
        assert!(a.pages.len() > 1);
        for (at, syms) in &spans {
            assert_eq!(a.get(*at, syms.len()), &syms[..]);
        }
        assert_eq!(a.held(), spans.iter().map(|(_, s)| s.len()).sum::<usize>());
    }

    #[test]
    fn a_released_span_is_reused_only_after_commit() {
        let mut a = Arena::default();
        let x = a.put(&[1, 2, 3]);
        a.commit();
        a.release(x, 3);
        let y = a.put(&[4, 5, 6]);
        assert_ne!(x, y, "not before the commit");
        assert_eq!(a.get(x, 3), &[1, 2, 3]);
        a.commit();
        a.release(y, 3);
        let z = a.put(&[7, 8, 9]);
        assert_eq!(z, x, "the committed release is reused");
        assert_eq!(a.held(), 3);
    }

    #[test]
    fn a_large_batch_leaves_no_room_behind_after_its_commit() {
        let mut a = Arena::default();
        let spans: Vec<u32> = (0..50_000).map(|i| a.put(&[i, i + 1])).collect();
        a.commit();
        for at in spans {
            a.release(at, 2);
        }
        a.commit();
        assert!(a.taken.capacity() <= BATCH_ROOM && a.released.capacity() <= BATCH_ROOM);
        assert_eq!((a.held(), a.free[2].len()), (0, 50_000), "every span reusable");
    }

    #[test]
    fn undo_restores_released_spans_and_frees_taken_ones() {
        let mut a = Arena::default();
        let x = a.put(&[1, 2]);
        a.commit();
        // A batch: the record moves to a new span, then is taken back.
        a.release(x, 2);
        let y = a.put(&[3, 4]);
        a.undo();
        assert_eq!((a.get(x, 2), a.held()), (&[1, 2][..], 2));
        // The batch's span is free again; the restored one is not.
        assert_eq!(a.put(&[5, 6]), y);
        assert_eq!(a.get(x, 2), &[1, 2]);
    }

    #[test]
    fn the_longest_span_fits_at_the_end_of_a_page() {
        let mut a = Arena::default();
        let filler = vec![7; MAX_SPAN - 1];
        for _ in 0..PAGE / (MAX_SPAN - 1) {
            a.put(&filler);
        }
        let long = vec![9; MAX_SPAN];
        let at = a.put(&long);
        assert_eq!(a.get(at, MAX_SPAN), &long[..]);
        assert_eq!(at & IN_PAGE, 0, "moved to a page of its own start");
    }
}
