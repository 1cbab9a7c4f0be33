//! The Hunch accelerator.
