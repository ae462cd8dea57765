//! Redis implementation of the window store (in progress).
