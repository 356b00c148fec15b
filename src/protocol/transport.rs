//! transport (below)
