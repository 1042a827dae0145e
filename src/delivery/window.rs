//! How one shuffle window's positions become its output indices: strided (see `placement.rs`)
//! when the window is a whole number of batches starting on a batch boundary, permuted
//! whole by a Feistel network otherwise.

use super::permute::{Permutation, mix, shuffle};

/// A window's bijection, from offsets in the window to offsets in its output indices
/// (see `placement.rs`).
#[derive(Debug, Clone)]
pub(crate) enum WindowOrder {
    /// A window of `m·B` rows whose strata each give one row to each of its batches.
    Strided(Strided),
    /// Any other window, permuted whole.
    Keyed(Permutation),
}

impl WindowOrder {
    /// A strided window of `batches` batches (`m`) of `strata` rows (`B`), drawn by `key`.
    pub(crate) fn strided(batches: u64, strata: u64, key: u64) -> Self {
        WindowOrder::Strided(Strided {
            batches,
            strata,
            key,
            stratum: None,
        })
    }

    /// Where offset `o` (< the window's length) goes. Offsets placed in ascending order
    /// cost O(1) each (a stratum's draw is made once); any offset costs at most O(`m`).
    #[inline]
    pub(crate) fn apply(&mut self, o: u64) -> u64 {
        match self {
            WindowOrder::Strided(s) => s.apply(o),
            WindowOrder::Keyed(p) => p.apply(o),
        }
    }
}

/// A strided window of `m·B` positions: position `a·m + c` (stratum `a < B`, `c < m`) goes
/// to offset `π_a(c)·B + a`, so batch `j` of the window takes, from every stratum, the row
/// `π_a` sends to it, at slot `a`: its rows in position order.
#[derive(Debug, Clone)]
pub(crate) struct Strided {
    /// `m`: the window's batches, and the positions of a stratum.
    batches: u64,
    /// `B`: the strata, and the rows of a batch.
    strata: u64,
    key: u64,
    /// The stratum last drawn, and its draw.
    stratum: Option<(u64, StratumDraw)>,
}

/// Which batch each row of a stratum goes to: a shuffled table for small strata (exactly
/// uniform), a Feistel network past [`TABLE_MAX`] (whose small domains are measurably
/// uneven, see `permute.rs`, and whose large ones need no table).
#[derive(Debug, Clone)]
enum StratumDraw {
    Table(Vec<u32>),
    Keyed(Permutation),
}

/// The largest stratum drawn as a table.
const TABLE_MAX: u64 = 1 << 12;

impl Strided {
    #[inline]
    fn apply(&mut self, o: u64) -> u64 {
        let m = self.batches;
        let (a, c) = (o / m, o % m);
        self.batch_of(a, c) * self.strata + a
    }

    /// `m`: the window's batches, and the positions of a stratum.
    pub(crate) fn batches(&self) -> u64 {
        self.batches
    }

    /// The batch of the window that row `c` of stratum `a` goes to (at slot `a`): what
    /// [`WindowOrder::apply`] works out, for a caller that walks the window's positions
    /// in order and so knows `a` and `c` without dividing.
    #[inline]
    pub(crate) fn batch_of(&mut self, a: u64, c: u64) -> u64 {
        let draw = match &self.stratum {
            Some((s, draw)) if *s == a => draw,
            _ => self.redraw(a),
        };
        match draw {
            StratumDraw::Table(t) => u64::from(t[c as usize]),
            StratumDraw::Keyed(p) => p.apply(c),
        }
    }

    /// Draws stratum `a`, refilling the last stratum's table rather than allocating one
    /// (a window places a stratum every `m` rows: 16 for Criteo's defaults).
    fn redraw(&mut self, a: u64) -> &StratumDraw {
        let (m, key) = (self.batches, mix(self.key ^ mix(a)));
        let draw = if m > TABLE_MAX {
            StratumDraw::Keyed(Permutation::new(m, key))
        } else {
            let mut table = match self.stratum.take() {
                Some((_, StratumDraw::Table(table))) => table,
                _ => Vec::new(),
            };
            table.clear();
            table.extend(0..m as u32);
            shuffle(&mut table, key);
            StratumDraw::Table(table)
        };
        &self.stratum.insert((a, draw)).1
    }
}
