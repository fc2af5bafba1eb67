//! The broker proper: subjects, subscription index, dispatch, control.
pub mod subject;
pub mod sublist;
