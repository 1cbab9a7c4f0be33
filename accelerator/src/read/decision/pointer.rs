//! kev's pointer head (`cls.output`): a `[2p, n_embd]` projection and its bias over final-norm
//! hidden states, whose first `p` outputs are the query and last `p` the key; an option scores
//! the query at the prompt's last position against the key at its marker, `q · k / √p`, as
//! llama-server's `send_decision` computes it (docs/models.md, "Decision models").

/// Why a kev model's pointer head cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PointerHeadError {
    #[error(
        "tensor {name} has shape {shape:?} (row-major), a kev pointer head needs [2p, {hidden}] \
         with p > 0"
    )]
    Weight {
        name: String,
        shape: Vec<usize>,
        hidden: usize,
    },
    #[error("tensor {name} has shape {shape:?}, a kev pointer head's bias needs [{rows}]")]
    Bias {
        name: String,
        shape: Vec<usize>,
        rows: usize,
    },
}

/// The head `cls.output` of a kev model: a `[2p, n_embd]` projection and its bias, whose first
/// `p` outputs are the query and last `p` the key.
#[derive(Debug, Clone, PartialEq)]
pub struct PointerHead {
    /// Row-major `[2p, hidden]`.
    weight: Vec<f32>,
    bias: Vec<f32>,
    p: usize,
    hidden: usize,
}

impl PointerHead {
    /// The head from its tensors' values and row-major shapes (named for errors), over hidden
    /// states of `hidden` values.
    pub fn new(
        (weight_name, weight, weight_shape): (&str, Vec<f32>, &[usize]),
        (bias_name, bias, bias_shape): (&str, Vec<f32>, &[usize]),
        hidden: usize,
    ) -> Result<PointerHead, PointerHeadError> {
        let rows = match weight_shape {
            [rows, cols] if *cols == hidden && *rows > 0 && rows.is_multiple_of(2) => *rows,
            _ => {
                return Err(PointerHeadError::Weight {
                    name: weight_name.to_string(),
                    shape: weight_shape.to_vec(),
                    hidden,
                })
            }
        };
        if bias_shape != [rows] || bias.len() != rows || weight.len() != rows * hidden {
            return Err(PointerHeadError::Bias {
                name: bias_name.to_string(),
                shape: bias_shape.to_vec(),
                rows,
            });
        }
        Ok(PointerHead {
            weight,
            bias,
            p: rows / 2,
            hidden,
        })
    }

    /// The width of the query and of the key.
    pub fn width(&self) -> usize {
        self.p
    }

    /// Output `row` of the head at a hidden state: `W[row] · h + b[row]`.
    fn output(&self, row: usize, hidden: &[f32]) -> f32 {
        let w = &self.weight[row * self.hidden..(row + 1) * self.hidden];
        w.iter().zip(hidden).map(|(a, b)| a * b).sum::<f32>() + self.bias[row]
    }

    /// Each option's score: the query at the pointer's hidden state against the key at each
    /// marker's, `q · k / √p`, as llama-server computes it (in float32). `None` where a hidden
    /// state is not `hidden` values long.
    pub fn scores(&self, pointer: &[f32], markers: &[Vec<f32>]) -> Option<Vec<f32>> {
        if pointer.len() != self.hidden || markers.iter().any(|m| m.len() != self.hidden) {
            return None;
        }
        let query: Vec<f32> = (0..self.p).map(|r| self.output(r, pointer)).collect();
        let scale = (self.p as f32).sqrt();
        Some(
            markers
                .iter()
                .map(|marker| {
                    let dot: f32 = query
                        .iter()
                        .enumerate()
                        .map(|(i, q)| q * self.output(self.p + i, marker))
                        .sum();
                    dot / scale
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> PointerHead {
        // p = 2 over hidden states of 3: query rows 0-1, key rows 2-3.
        let weight = vec![
            1.0, 0.0, 0.0, //
            0.0, 1.0, 0.0, //
            0.0, 0.0, 1.0, //
            1.0, 1.0, 0.0,
        ];
        let bias = vec![0.0, 0.5, 0.0, -1.0];
        PointerHead::new(("w", weight, &[4, 3]), ("b", bias, &[4]), 3).expect("head")
    }

    #[test]
    fn the_pointer_scores_are_query_dot_key_over_the_root_of_p() {
        let head = head();
        assert_eq!(head.width(), 2);
        // query(pointer) = [1, 2.5]; key(m) = [m2, m0 + m1 - 1].
        let scores = head
            .scores(
                &[1.0, 2.0, 0.0],
                &[vec![0.0, 0.0, 2.0], vec![1.0, 1.0, 0.0]],
            )
            .expect("scores");
        let root = 2f32.sqrt();
        assert_eq!(scores, vec![(1.0 * 2.0 - 2.5) / root, 2.5 / root]);
        assert!(head.scores(&[1.0], &[]).is_none());
    }

    #[test]
    fn a_head_of_the_wrong_shape_is_refused_naming_the_tensor() {
        let err = PointerHead::new(
            ("cls.output.weight", vec![0.0; 9], &[3, 3]),
            ("b", vec![0.0; 3], &[3]),
            3,
        )
        .expect_err("odd rows");
        assert!(err.to_string().contains("cls.output.weight"), "{err}");
        let err = PointerHead::new(
            ("cls.output.weight", vec![0.0; 8], &[2, 4]),
            ("b", vec![0.0; 2], &[2]),
            3,
        )
        .expect_err("wrong width");
        assert!(err.to_string().contains("[2p, 3]"), "{err}");
        let err = PointerHead::new(
            ("w", vec![0.0; 12], &[4, 3]),
            ("cls.output.bias", vec![0.0; 3], &[3]),
            3,
        )
        .expect_err("short bias");
        assert!(
            err.to_string().contains("cls.output.bias") && err.to_string().contains("[4]"),
            "{err}"
        );
    }
}
