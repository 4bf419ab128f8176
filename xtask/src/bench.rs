//! `cargo xtask bench`: the benches it knows and how each is run.

use crate::args::BenchTarget;
use crate::redis::{Standalone, Tools};
use crate::{run_cargo, workspace_root, Error, Result, Stages};

/// One criterion bench `cargo xtask bench` knows.
#[derive(Debug, Clone, Copy)]
struct Bench {
    /// The package.
    package: &'static str,
    /// The package's directory, relative to the workspace root.
    dir: &'static str,
    /// The bench target name (`benches/<name>.rs`).
    name: &'static str,
    /// Whether it needs a Redis server.
    needs_redis: bool,
}

impl Bench {
    /// The bench for a single target.
    fn of(target: BenchTarget) -> Self {
        match target {
            // `All` never reaches here (`BenchTarget::expand` splits it).
            BenchTarget::Core | BenchTarget::All => Self {
                package: "portcullis-core",
                dir: "crates/portcullis-core",
                name: "memory_cost",
                needs_redis: false,
            },
            BenchTarget::Redis => Self {
                package: "portcullis-redis",
                dir: "crates/portcullis-redis",
                name: "redis_throughput",
                needs_redis: true,
            },
            BenchTarget::Http => Self {
                package: "portcullis-tower",
                dir: "crates/portcullis-tower",
                name: "http_throughput",
                needs_redis: true,
            },
            // Starts its own servers; the tools' environment names the
            // redis-server binary.
            BenchTarget::Envoy => Self {
                package: "portcullis-envoy",
                dir: "crates/portcullis-envoy",
                name: "rls_redis",
                needs_redis: true,
            },
            // A binary, not a criterion bench: it starts its own servers.
            BenchTarget::Scale => Self {
                package: "portcullis-tests",
                dir: "tests",
                name: "scale",
                needs_redis: false,
            },
        }
    }

    /// Whether it is a binary (`src/bin/<name>.rs`, run with `cargo run
    /// --release`) rather than a criterion bench.
    fn is_binary(self) -> bool {
        self.dir == "tests"
    }

    /// The bench's source file, relative to the workspace root.
    fn source(self) -> String {
        if self.is_binary() {
            format!("{}/src/bin/{}.rs", self.dir, self.name)
        } else {
            format!("{}/benches/{}.rs", self.dir, self.name)
        }
    }
}

/// `cargo xtask bench <target>`.
pub(crate) fn bench(target: BenchTarget, bench_args: &[String]) -> Result<()> {
    let benches: Vec<Bench> = target.expand().iter().map(|t| Bench::of(*t)).collect();
    // Check every file first: `all` should not run for minutes, then fail.
    for bench in &benches {
        if !workspace_root().join(bench.source()).is_file() {
            return Err(Error::new(format!(
                "the bench {} does not exist yet: add it (with a `[[bench]] name = \"{}\" \
                 harness = false` entry in {}/Cargo.toml), or pick another target",
                bench.source(),
                bench.name,
                bench.dir
            )));
        }
    }
    let tools = if benches.iter().any(|b| b.needs_redis) {
        Some(Tools::discover()?)
    } else {
        None
    };
    let mut stages = Stages::new(benches.len());
    let result = benches.iter().try_for_each(|bench| {
        let mut args = if bench.is_binary() {
            vec!["run", "--release", "-p", bench.package, "--bin", bench.name]
        } else {
            vec!["bench", "-p", bench.package, "--bench", bench.name]
        };
        if !bench_args.is_empty() {
            args.push("--");
            args.extend(bench_args.iter().map(String::as_str));
        }
        let shown = format!("cargo {}", args.join(" "));
        stages.run(&shown, || {
            // A fresh server per bench, so one bench's keys never affect another.
            let server = match (&tools, bench.needs_redis) {
                (Some(tools), true) => Some(Standalone::start(tools)?),
                _ => None,
            };
            let mut env = Vec::new();
            if let (Some(tools), Some(server)) = (&tools, &server) {
                println!("    redis-server: {}", server.url());
                env.extend(server.env());
                env.extend(tools.env());
            }
            run_cargo(&args, &env, "the bench failed (see above)")
        })
    });
    stages.print_summary();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_sources_point_into_their_crates() {
        assert_eq!(
            Bench::of(BenchTarget::Redis).source(),
            "crates/portcullis-redis/benches/redis_throughput.rs"
        );
        assert_eq!(
            Bench::of(BenchTarget::Core).source(),
            "crates/portcullis-core/benches/memory_cost.rs"
        );
        assert!(!Bench::of(BenchTarget::Core).needs_redis);
        assert!(Bench::of(BenchTarget::Http).needs_redis);
        assert_eq!(
            Bench::of(BenchTarget::Envoy).source(),
            "crates/portcullis-envoy/benches/rls_redis.rs"
        );
    }
}
