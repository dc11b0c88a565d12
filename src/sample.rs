//! A uniform random draw of at most `n` items from a stream of unknown
//! length, in memory for `n` items (reservoir sampling): `verify
//! --sample`'s keys and `memory`'s measured keys.

/// The draw so far: every item offered replaces a kept one with
/// probability n / offered.
#[derive(Debug, Clone)]
pub struct Reservoir<T> {
    n: usize,
    offered: u64,
    kept: Vec<T>,
}

impl<T> Reservoir<T> {
    pub fn new(n: usize) -> Reservoir<T> {
        Reservoir { n, offered: 0, kept: Vec::new() }
    }

    pub fn offer(&mut self, item: T) {
        self.offered += 1;
        if self.kept.len() < self.n {
            self.kept.push(item);
        } else if let Some(slot) = self.kept.get_mut(rand::random_range(0..self.offered) as usize) {
            *slot = item;
        }
    }

    /// How many items were offered.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    pub fn into_kept(self) -> Vec<T> {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_n_of_what_it_was_offered() {
        let mut r = Reservoir::new(3);
        (0..2).for_each(|i| r.offer(i));
        assert_eq!(r.clone().into_kept(), vec![0, 1], "fewer than n: all of them");
        (2..1000).for_each(|i| r.offer(i));
        let kept = r.clone().into_kept();
        assert_eq!((kept.len(), r.offered()), (3, 1000));
        assert!(kept.iter().all(|i| (0..1000).contains(i)));
        assert!(Reservoir::<u8>::new(0).into_kept().is_empty());
    }
}
