//! Placeholder: being written (see the scenario brief).
