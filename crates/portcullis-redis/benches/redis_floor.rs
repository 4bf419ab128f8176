//! The floor under a check's cost on the Redis core: server instructions
//! per check of `peers/floor_library.lua`, the least a Lua check of one
//! key costs on this server (read the state, write it back with an
//! expiry), one key per call and 50 keys per call, beside portcullis' own
//! figures of `redis_throughput` (BENCHMARKS.md, "The floor of a check in
//! Lua"). It tells how far below a script's cost any Lua limiter can go:
//! not a peer, no exactness.
//!
//! `PORTCULLIS_REDIS_SERVER=$(which redis-server) cargo bench -p
//! portcullis-redis --bench redis_floor`: redis-server under valgrind's
//! callgrind, pinned to core 0; two call counts, the difference in
//! instructions over the difference in checks. Keys are random over 100k
//! (new keys, as `redis_throughput`'s random workload), sent 50 commands
//! a pipeline.

#[path = "support/server.rs"]
mod server;
use server::Server;

const KEYS: u64 = 100_000;
const PIPELINE: u64 = 50;
/// Checks of the two counts.
const SMALL: u64 = 1_000;
const LARGE: u64 = 4_000;
/// The interval of the floor's checks, µs (100/s).
const INTERVAL: u64 = 10_000;

fn main() {
    let server = Server::start(true);
    let client = redis::Client::open(server.url()).expect("a URL");
    let mut connection = client.get_connection().expect("a connection");
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/floor_library.lua"),
    )
    .expect("benches/peers/floor_library.lua");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&source)
        .query(&mut connection)
        .expect("FUNCTION LOAD (Redis 7 or later)");
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut key = move || {
        // xorshift: random keys over KEYS, the same sequence each run.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        format!("floor:{{{}}}", state % KEYS)
    };
    println!("| the floor, per check | server instructions |");
    println!("|---|---|");
    for (label, per_call) in [
        ("one key per call (`floor_one`)", 1),
        ("50 keys per call (`floor_many`)", 50),
    ] {
        let mut counts = Vec::new();
        for checks in [SMALL, LARGE] {
            let _ = server.instructions();
            let calls = checks / per_call;
            let mut sent = 0;
            while sent < calls {
                let mut pipe = redis::pipe();
                for _ in 0..PIPELINE.min(calls - sent) {
                    let keys: Vec<String> = (0..per_call).map(|_| key()).collect();
                    let name = if per_call == 1 {
                        "floor_one"
                    } else {
                        "floor_many"
                    };
                    pipe.cmd("FCALL")
                        .arg(name)
                        .arg(per_call)
                        .arg(&keys)
                        .arg(INTERVAL);
                    sent += 1;
                }
                let _: Vec<redis::Value> = pipe.query(&mut connection).expect("the floor's calls");
            }
            counts.push(server.instructions());
        }
        #[allow(clippy::cast_precision_loss)]
        let per_check = (counts[1] - counts[0]) as f64 / (LARGE - SMALL) as f64;
        println!("| {label} | {:.1}k |", per_check / 1000.0);
    }
}
