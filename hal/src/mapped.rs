//! Ranges of caller memory that span several mappings.
//!
//! A virtual-memory allocator (PyTorch's expandable segments, JAX's and NCCL's own `cuMem*`
//! pools) reserves one address range and maps physical pieces into it as it grows. A runtime
//! names each piece as its own allocation (`cuMemGetAddressRange` answers for one mapping), so a
//! tensor that crosses a piece boundary is not "inside one allocation", yet every byte of it is
//! mapped and a kernel reads it as one range — NCCL serves it. [`mapped_extent`] is the one walk
//! that decides: it follows the mappings from the one holding the range's start, each starting
//! where the previous one ends, until the range is covered or a gap is found.

use crate::{Error, Result};

/// The most mappings one range may span before the walk gives up (a 1 TiB range of 2 MiB pieces
/// is half a million): a bound, so that a lookup that never advances cannot loop for ever.
pub const MAX_MAPPINGS: usize = 1 << 20;

/// Contiguous mapped memory holding a range: from the start of the mapping holding the range's
/// first byte to the end of the mapping holding its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Start of the first mapping.
    pub base: u64,
    /// Bytes from `base` to the end of the last mapping.
    pub len: usize,
    /// How many mappings the range spans (1 for memory of one allocation).
    pub mappings: usize,
}

impl Extent {
    /// Whether `bytes` at `ptr` lie inside the extent.
    pub fn holds(&self, ptr: u64, bytes: usize) -> bool {
        ptr >= self.base
            && (ptr - self.base)
                .checked_add(bytes as u64)
                .is_some_and(|end| end <= self.len as u64)
    }
}

/// The mapped memory holding `len` bytes at `ptr`, found by asking `lookup` for the mapping
/// that holds an address (its base and length; `None` where nothing is mapped there).
///
/// `Ok(None)` when nothing is mapped at `ptr` (the caller decides what that means: not this
/// runtime's memory); an error naming the gap when the range runs past the end of the mapped
/// memory; `Ok(Some(extent))` when the range is covered, by one mapping or several.
pub fn mapped_extent(
    ptr: u64,
    len: usize,
    mut lookup: impl FnMut(u64) -> Result<Option<(u64, usize)>>,
) -> Result<Option<Extent>> {
    // A mapping that does not hold the address it was asked about is no answer.
    let Some((base, size)) = lookup(ptr)?.filter(|&(b, s)| b <= ptr && ptr - b < s as u64) else {
        return Ok(None);
    };
    let want = ptr.checked_add(len as u64).ok_or_else(|| {
        Error::invalid(format!(
            "{len} bytes at {ptr:#x} run past the end of the address space"
        ))
    })?;
    let mut end = base.saturating_add(size as u64);
    let mut mappings = 1;
    while end < want {
        if mappings >= MAX_MAPPINGS {
            return Err(Error::invalid(format!(
                "{len} bytes at {ptr:#x} span more than {MAX_MAPPINGS} mappings"
            )));
        }
        let next = lookup(end)?.filter(|&(b, s)| b <= end && end - b < s as u64);
        let Some((b, s)) = next else {
            return Err(Error::invalid(format!(
                "{len} bytes at {ptr:#x} run past the end of their memory: {} bytes are mapped \
                 from there ({mappings} mapping{} from {base:#x}), then nothing at {end:#x}",
                end - ptr,
                if mappings == 1 { "" } else { "s" },
            )));
        };
        end = b.saturating_add(s as u64);
        mappings += 1;
    }
    let len = usize::try_from(end - base).map_err(|_| {
        Error::invalid(format!(
            "mapped memory from {base:#x} to {end:#x} is too large"
        ))
    })?;
    Ok(Some(Extent {
        base,
        len,
        mappings,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mappings at 0x1000.. of the given sizes, back to back, with a gap before `gap_at` (index).
    fn table(sizes: &[u64], gap_before: Option<usize>) -> Vec<(u64, usize)> {
        let mut at = 0x1000;
        let mut v = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            if gap_before == Some(i) {
                at += 0x100;
            }
            v.push((at, s as usize));
            at += s;
        }
        v
    }

    fn lookup(t: &[(u64, usize)]) -> impl FnMut(u64) -> Result<Option<(u64, usize)>> + '_ {
        |p| Ok(t.iter().copied().find(|&(b, s)| p >= b && p - b < s as u64))
    }

    #[test]
    fn one_mapping_is_one_extent() {
        let t = table(&[0x100], None);
        let e = mapped_extent(0x1010, 0x20, lookup(&t)).unwrap().unwrap();
        assert_eq!(
            e,
            Extent {
                base: 0x1000,
                len: 0x100,
                mappings: 1
            }
        );
        assert!(e.holds(0x1010, 0x20) && !e.holds(0x10f0, 0x20));
    }

    #[test]
    fn a_range_across_pieces_is_covered_from_inside_the_first() {
        let t = table(&[0x100, 0x200, 0x100], None);
        // Starts inside the first piece, ends inside the third.
        let e = mapped_extent(0x1080, 0x300, lookup(&t)).unwrap().unwrap();
        assert_eq!((e.base, e.len, e.mappings), (0x1000, 0x400, 3));
        // Starts inside the second, ends at its end: one mapping.
        let e = mapped_extent(0x1180, 0x180, lookup(&t)).unwrap().unwrap();
        assert_eq!((e.base, e.len, e.mappings), (0x1100, 0x200, 1));
    }

    #[test]
    fn a_gap_or_the_end_is_refused_naming_where_mapped_memory_stops() {
        let t = table(&[0x100, 0x100], Some(1));
        let err = mapped_extent(0x1080, 0x100, lookup(&t))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nothing at 0x1100"), "{err}");
        assert!(err.contains("128 bytes are mapped"), "{err}");
        let t = table(&[0x100, 0x100], None);
        let err = mapped_extent(0x1080, 0x200, lookup(&t))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 mappings") && err.contains("nothing at 0x1200"),
            "{err}"
        );
    }

    #[test]
    fn unknown_memory_is_none_and_lookup_errors_pass_through() {
        let t = table(&[0x100], None);
        assert_eq!(mapped_extent(0x9000, 8, lookup(&t)).unwrap(), None);
        let failing = |_| Err(Error::invalid("driver down"));
        assert!(mapped_extent(0x1000, 8, failing).is_err());
    }

    #[test]
    fn a_lookup_that_does_not_hold_the_address_is_not_followed() {
        // A runtime answering with a mapping that ends before the address asked about must not
        // make the walk loop or accept the range.
        let mut calls = 0;
        let stuck = |p: u64| {
            calls += 1;
            Ok(Some((0x1000.min(p), 0x10)))
        };
        let err = mapped_extent(0x1000, 0x100, stuck).unwrap_err().to_string();
        assert!(err.contains("nothing at 0x1010"), "{err}");
        assert_eq!(calls, 2);
    }
}
