//! pki (below)
