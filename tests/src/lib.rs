//! Support code for the cross-crate tests in `tests/tests/`.
