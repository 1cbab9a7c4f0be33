//! The Hunch server.
