//! Tests of rule compilation: the shipped folder, every validation rule (file, line and
//! field of its error), set-wide rules, versions and durations.

mod challenge;
mod dimensions;
mod fields;
mod grammar;
mod limits;
mod scene;
mod set;
mod shipped;
mod signals;
mod support;
mod trust;
