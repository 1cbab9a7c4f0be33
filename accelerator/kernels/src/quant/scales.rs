//! A packed weight's scales and biases: a float32 value per row and part (32 inputs, or 16),
//! held as the values themselves ([`Parts::Floats`]), as a small integer times a unit per 256
//! inputs where the file stores them so ([`Parts::Factored`]: ggml's K-quants, whose scales are
//! a 6- or 8-bit integer times a super-block's float16), or, for biases, not at all where each
//! is the same multiple of its scale ([`Biases::Implicit`]).
//!
//! Whatever the form, a value is the same float32 operation (a load, or one product), and the
//! packing keeps a form only where it gives every value's bits as given (checked value by value,
//! never assumed from a file's type), so the products' bits do not depend on the form. The SIMD
//! copies read a panel's values as float32 computed once per pass ([`PanelValues`]): with the
//! forms matched inside their inner loops the AVX-512 copy's registers spilled (1,290 vector
//! moves to or from the stack in its tile, the 8-bit-input products at half their rate).

use super::PANEL;

/// Blocks of 32 inputs per unit of factored values: ggml's super-block of 256.
const SUPER_BLOCKS: usize = 8;

/// Where a weight's per-part values are: value `at` is row `at % 16` of part `at / 16 % parts`
/// of block `at / 16 / parts % blocks` of panel `at / (16 · parts · blocks)`; a factored value's
/// unit is row `at % 16` of its panel's `j / 8`-th super-block.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub(super) blocks: usize,
    pub(super) parts: usize,
}

impl Geometry {
    /// Values a panel holds.
    pub(super) fn per_panel(self) -> usize {
        self.blocks * self.parts * PANEL
    }

    /// Super-blocks a row has (the last may be short).
    pub(super) fn supers(self) -> usize {
        self.blocks.div_ceil(SUPER_BLOCKS)
    }

    /// The unit of value `at`.
    fn unit_of(self, at: usize) -> usize {
        let block = at / PANEL / self.parts;
        let (panel, j) = (block / self.blocks, block % self.blocks);
        (panel * self.supers() + j / SUPER_BLOCKS) * PANEL + at % PANEL
    }
}

/// Scales or biases, per panel, per block, per part, 16 rows.
#[derive(Clone, Debug)]
pub(super) enum Parts {
    /// The float32 values.
    Floats(Vec<f32>),
    /// Each value `unit · small` in float32: `units` per panel, per super-block, 16 rows;
    /// `small` in the values' layout, a byte each.
    Factored { units: Vec<f32>, small: Vec<i8> },
}

impl Parts {
    /// Value `at`.
    #[inline(always)]
    pub(super) fn value(&self, g: Geometry, at: usize) -> f32 {
        match self {
            Parts::Floats(values) => values[at],
            Parts::Factored { units, small } => units[g.unit_of(at)] * f32::from(small[at]),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Parts::Floats(values) => 4 * values.len(),
            Parts::Factored { units, small } => 4 * units.len() + small.len(),
        }
    }
}

/// A weight's biases: stored, or each `offset · scale`.
#[derive(Clone, Debug)]
pub(super) enum Biases {
    Stored(Parts),
    /// Every row's every bias is `offset · scale` bit for bit (Q4_0's −8, Q5_0's −16, Q8_0's
    /// −128, Q6_K's −32): each copy computes it as that one float32 product.
    Implicit(f32),
}

impl Biases {
    pub(super) fn bytes(&self) -> usize {
        match self {
            Biases::Stored(parts) => parts.bytes(),
            Biases::Implicit(_) => 0,
        }
    }
}

/// A panel's scales and biases as float32 values (per block, per part, 16 rows), what the SIMD
/// copies read: borrowed where the weight holds floats, else computed here once per panel and
/// pass (each value `unit · small` or `offset · scale`, the operations of [`Parts::value`] and
/// the portable copy, so the same bits), which keeps every copy's inner loop free of the forms:
/// a vectorised loop over 16 values a part, against the panel's `16 · input` byte products per
/// row.
#[derive(Default)]
pub(super) struct PanelValues {
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl Parts {
    /// Panel `panel`'s values: borrowed, or computed into `into`.
    fn panel_values<'a>(&'a self, g: Geometry, panel: usize, into: &'a mut Vec<f32>) -> &'a [f32] {
        let per_panel = g.per_panel();
        match self {
            Parts::Floats(values) => &values[panel * per_panel..][..per_panel],
            Parts::Factored { units, small } => {
                into.clear();
                let units = &units[panel * g.supers() * PANEL..][..g.supers() * PANEL];
                let small = &small[panel * per_panel..][..per_panel];
                for (j, block) in small.chunks_exact(g.parts * PANEL).enumerate() {
                    let unit = &units[j / SUPER_BLOCKS * PANEL..][..PANEL];
                    for part in block.chunks_exact(PANEL) {
                        into.extend(unit.iter().zip(part).map(|(u, &s)| u * f32::from(s)));
                    }
                }
                into
            }
        }
    }
}

impl PanelValues {
    /// Panel `panel`'s scales and biases.
    pub(super) fn of<'a>(
        &'a mut self,
        g: Geometry,
        scales: &'a Parts,
        biases: &'a Biases,
        panel: usize,
    ) -> (&'a [f32], &'a [f32]) {
        let PanelValues {
            scales: scale_buffer,
            biases: bias_buffer,
        } = self;
        let scales = scales.panel_values(g, panel, scale_buffer);
        let biases = match biases {
            Biases::Stored(parts) => parts.panel_values(g, panel, bias_buffer),
            Biases::Implicit(offset) => {
                bias_buffer.clear();
                bias_buffer.extend(scales.iter().map(|s| offset * s));
                bias_buffer
            }
        };
        (scales, biases)
    }
}

/// One row's values as a loader gives them: the float32 values, and optionally each as a small
/// integer times a unit per 256 inputs (as the file stores it), all to be filled; left as they
/// are (zeros), the factors are not used.
pub struct RowValues<'a> {
    pub values: &'a mut [f32],
    /// One per 256 inputs (the last may cover fewer).
    pub units: &'a mut [f32],
    /// One per value.
    pub small: &'a mut [i8],
}

/// Scales or biases while a weight's rows are packed: the float32 values, and their factors for
/// as long as every row's factors give its values bit for bit (finite ones: a NaN's bits through
/// a product are the hardware's to choose).
pub(super) struct PartsBuilder {
    g: Geometry,
    floats: Vec<f32>,
    units: Vec<f32>,
    small: Vec<i8>,
    factored: bool,
}

impl PartsBuilder {
    pub(super) fn new(g: Geometry, panels: usize) -> Self {
        PartsBuilder {
            g,
            floats: vec![0.0; panels * g.per_panel()],
            units: vec![0.0; panels * g.supers() * PANEL],
            small: vec![0; panels * g.per_panel()],
            factored: true,
        }
    }

    /// Row `n`'s values (`blocks · parts`), units (`supers`) and small integers.
    pub(super) fn put_row(&mut self, n: usize, values: &[f32], units: &[f32], small: &[i8]) {
        let (panel, row) = (n / PANEL, n % PANEL);
        let per_super = SUPER_BLOCKS * self.g.parts;
        for (p, &v) in values.iter().enumerate() {
            let at = panel * self.g.per_panel() + p * PANEL + row;
            self.floats[at] = v;
            self.small[at] = small[p];
            let unit = units[p / per_super];
            self.factored &= v.is_finite() && (unit * f32::from(small[p])).to_bits() == v.to_bits();
        }
        for (s, &u) in units.iter().enumerate() {
            self.units[(panel * self.g.supers() + s) * PANEL + row] = u;
        }
    }

    /// The float32 values so far.
    pub(super) fn floats(&self) -> &[f32] {
        &self.floats
    }

    /// The values in the smallest form that gives them all.
    pub(super) fn finish(self) -> Parts {
        if self.factored {
            Parts::Factored {
                units: self.units,
                small: self.small,
            }
        } else {
            Parts::Floats(self.floats)
        }
    }
}

/// The offset `o` such that every row's bias is `o · scale` bit for bit, if there is one: `o`
/// from the first row with a non-zero scale (`bias / scale`; a division that does not round-trip
/// fails the check below, which is what decides). Rows past `out` (the last panel's padding,
/// zeros) are never stored, so they are not looked at. Scales that are not finite keep the
/// biases stored (a NaN's bits through a product are the hardware's to choose).
pub(super) fn implicit_offset(
    out: usize,
    per_panel: usize,
    scales: &[f32],
    biases: &[f32],
) -> Option<f32> {
    // Value `at` is row `at % PANEL` of panel `at / per_panel`.
    let real = |at: &usize| (at / per_panel) * PANEL + at % PANEL < out;
    if scales.iter().any(|s| !s.is_finite()) {
        return None;
    }
    let offset = (0..scales.len())
        .filter(real)
        .find(|&at| scales[at] != 0.0)
        .map(|at| biases[at] / scales[at])
        // Every scale zero: the biases must then be zeros of one sign (`±1 · 0`).
        .or_else(|| biases.first().map(|b| 1.0f32.copysign(*b)))?;
    let holds = (0..scales.len())
        .filter(real)
        .all(|at| (offset * scales[at]).to_bits() == biases[at].to_bits());
    holds.then_some(offset)
}
