#![deny(unsafe_op_in_unsafe_fn)]
