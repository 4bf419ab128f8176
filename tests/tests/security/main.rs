//! Abuse and hostile input: key floods, hostile subjects and headers,
//! untrusted policies.
//!
//! One test binary (each module is one suite of its own, its tests
//! named `<module>::<test>`), so the stack is compiled and linked
//! once for all of them.

mod isolation_flood;
mod security_abuse;
mod security_input;
mod security_keys;
mod security_policies;
