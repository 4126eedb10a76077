//! A resource made at its first use and kept, with the error of its first attempt kept whole.

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// A resource made at its first use and kept, or the error its first attempt met (kept whole
/// and reported by every later use as [`Error::Earlier`]).
pub(crate) struct Lazy<T> {
    what: &'static str,
    cell: OnceLock<std::result::Result<T, Arc<Error>>>,
}

impl<T> Lazy<T> {
    pub(crate) const fn new(what: &'static str) -> Lazy<T> {
        Lazy {
            what,
            cell: OnceLock::new(),
        }
    }

    /// The resource, made by `make` if this is its first use.
    pub(crate) fn get(&self, make: impl FnOnce() -> Result<T>) -> Result<&T> {
        self.cell
            .get_or_init(|| make().map_err(Arc::new))
            .as_ref()
            .map_err(|e| Error::Earlier {
                what: self.what,
                source: e.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lazy_resource_is_made_once_and_keeps_its_first_error() {
        let made = std::cell::Cell::new(0);
        let ok: Lazy<u32> = Lazy::new("a number");
        for _ in 0..3 {
            let v = ok.get(|| {
                made.set(made.get() + 1);
                Ok(7)
            });
            assert_eq!(*v.expect("made"), 7);
        }
        assert_eq!(made.get(), 1);
        let bad: Lazy<u32> = Lazy::new("the SM copy kernel");
        let first = bad
            .get(|| Err(Error::InvalidArgument("no NVRTC".into())))
            .expect_err("fails")
            .to_string();
        // A later use does not try again: it reports the first error, whole, with what failed.
        let later = bad
            .get(|| unreachable!("made again"))
            .expect_err("still fails");
        assert!(matches!(later, Error::Earlier { .. }), "{later:?}");
        assert!(
            first.contains("the SM copy kernel") && first.contains("no NVRTC"),
            "{first}"
        );
        assert_eq!(first, later.to_string());
    }
}
