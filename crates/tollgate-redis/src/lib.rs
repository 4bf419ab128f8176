//! Redis store for tollgate (docs to come).

mod connection;
mod scripts;
mod store;

pub use store::{
    BuildError, CheckFuture, ClockMode, RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, MAX_PREFIX_LEN,
};

pub use bb8;
pub use redis;
