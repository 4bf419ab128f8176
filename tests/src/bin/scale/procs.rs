//! The scale bench's processes as the bench drives them: a redis-server
//! pinned to core 0 (under callgrind when asked), three app instances
//! pinned to core 1, one load run and its figures, and the CPU seconds
//! Redis and the instances spent in it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{CONNECTIONS, INSTANCES};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

fn redis_server() -> String {
    std::env::var("PORTCULLIS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The ACL user of the `EVALSHA` configurations.
const EVALSHA_USER: &str = "portcullis-scale-evalsha";
const EVALSHA_PASSWORD: &str = "scale";

/// A redis-server pinned to CPU 0, under callgrind when asked.
pub(crate) struct Redis {
    child: Child,
    port: u16,
    callgrind_out: Option<PathBuf>,
}

impl Redis {
    pub(crate) fn start(callgrind: bool) -> Result<Self, String> {
        let port = free_port();
        let out = std::env::temp_dir().join(format!("portcullis-scale-callgrind.{port}"));
        let mut command = Command::new("taskset");
        command.args(["-c", "0"]);
        if callgrind {
            command.args([
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=no",
                &format!("--callgrind-out-file={}", out.display()),
            ]);
        }
        command.arg(redis_server()).args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        if callgrind {
            // Its timer work (expiry, statistics) is counted with the
            // calls: once a second rather than ten times, so that it
            // weighs little beside a run's calls, even where they are as
            // few as the local budget makes (as `redis_throughput`'s
            // server).
            command.args(["--hz", "1"]);
        }
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let child = command
            .spawn()
            .map_err(|e| format!("starting redis-server (taskset, valgrind): {e}"))?;
        let redis = Self {
            child,
            port,
            callgrind_out: callgrind.then_some(out),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while redis.query(&["PING"]).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not answer within 60 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // The user of the `EVALSHA` configurations: everything but Redis
        // Functions, as an ACL without `FCALL` (or Redis 6.2) leaves a
        // store. Redis before 7 knows no `FCALL` to deny, and has no
        // Functions anyway.
        // (A password: the client logs in only when the URL has one.)
        let password = format!(">{EVALSHA_PASSWORD}");
        let mut user = vec![
            "ACL",
            "SETUSER",
            EVALSHA_USER,
            "on",
            &password,
            "~*",
            "+@all",
        ];
        if redis
            .query(&[&user[..], &["-fcall", "-fcall_ro", "-function"]].concat())
            .is_err()
        {
            user.push("&*");
            redis.query(&user)?;
        }
        Ok(redis)
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The URL of the user without Redis Functions: its stores take the
    /// `EVALSHA` path.
    pub(crate) fn evalsha_url(&self) -> String {
        format!(
            "redis://{EVALSHA_USER}:{EVALSHA_PASSWORD}@127.0.0.1:{}",
            self.port
        )
    }

    pub(crate) fn query(&self, args: &[&str]) -> Result<String, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let mut connection = client.get_connection().map_err(|e| e.to_string())?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let value: redis::Value = cmd.query(&mut connection).map_err(|e| e.to_string())?;
        Ok(match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => format!("{other:?}"),
        })
    }

    /// CPU seconds (user and system) the server has spent so far.
    pub(crate) fn cpu(&self) -> Result<f64, String> {
        portcullis_tests::cpu::cpu_seconds(self.child.id(), &process_name(&redis_server()))
    }

    /// Script and function calls served so far.
    pub(crate) fn calls(&self) -> u64 {
        let info = self.query(&["INFO", "commandstats"]).unwrap_or_default();
        info.lines()
            .filter(|line| {
                ["cmdstat_fcall:", "cmdstat_fcall_ro:", "cmdstat_evalsha:"]
                    .iter()
                    .any(|p| line.starts_with(p))
            })
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Instructions since the last call (callgrind dumps, then the total
    /// of the newest dump's summary).
    pub(crate) fn instructions(&self) -> u64 {
        let Some(out) = &self.callgrind_out else {
            return 0;
        };
        let _ = Command::new("callgrind_control")
            .args(["-d", &self.child.id().to_string()])
            .output();
        let dir = out.parent().map(PathBuf::from).unwrap_or_default();
        let stem = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let newest = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
        newest
            .and_then(|e| std::fs::read_to_string(e.path()).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The output file and every dump `callgrind_control -d` wrote
        // beside it (`<out>.1`, `<out>.2`, ...).
        if let Some(out) = &self.callgrind_out {
            let name = out
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dumps = format!("{name}.");
            let dir = out.parent().map(PathBuf::from).unwrap_or_default();
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if file == name || file.starts_with(&dumps) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// Three app instances of one configuration, pinned to CPU 1.
pub(crate) struct Instances {
    pub(crate) children: Vec<Child>,
    pub(crate) ports: Vec<u16>,
}

impl Instances {
    pub(crate) fn start(
        store: &str,
        redis: Option<&Redis>,
        limit: (u64, u64),
        prefix: &str,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..INSTANCES {
            let port = free_port();
            let mut command = Command::new("taskset");
            command
                .args(["-c", "1"])
                .arg(&exe)
                .args(["serve", "--port", &port.to_string(), "--store", store])
                .args([
                    "--limit",
                    &limit.0.to_string(),
                    "--burst",
                    &limit.1.to_string(),
                ])
                .args(["--prefix", prefix]);
            if let Some(redis) = redis {
                let url = if store.ends_with("-evalsha") {
                    redis.evalsha_url()
                } else {
                    redis.url()
                };
                command.args(["--redis", &url]);
            }
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting an instance: {e}"))?;
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            if line.trim() != "ready" {
                let _ = child.kill();
                return Err(format!("an instance ({store}) did not start"));
            }
            children.push(child);
            ports.push(port);
        }
        Ok(Self { children, ports })
    }
}

impl Instances {
    /// CPU seconds (user and system) the instances have spent so far, summed.
    pub(crate) fn cpu(&self) -> Result<f64, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let name = process_name(&exe.to_string_lossy());
        self.children
            .iter()
            .map(|child| portcullis_tests::cpu::cpu_seconds(child.id(), &name))
            .sum()
    }
}

/// The name Linux gives a process started from `path` (`/proc/<pid>/stat`'s
/// second field: the file name, at most 15 bytes).
fn process_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.chars()
        .scan(0, |bytes, c| {
            *bytes += c.len_utf8();
            (*bytes <= 15).then_some(c)
        })
        .collect()
}

impl Drop for Instances {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One load run's figures.
#[derive(Clone, Default)]
pub(crate) struct Run {
    pub(crate) requests: u64,
    pub(crate) ok: u64,
    pub(crate) limited: u64,
    pub(crate) other: u64,
    pub(crate) per_second: f64,
    pub(crate) secs: f64,
    /// CPU seconds Redis and the three instances spent during the run
    /// (0 when not measured).
    pub(crate) redis_cpu: f64,
    pub(crate) app_cpu: f64,
    /// CPU seconds core 0 (Redis' core) was busy with anything else.
    pub(crate) core0_other: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) buckets: Vec<u64>,
}

pub(crate) fn run_load(ports: &[u16], hot: bool, flag: &str, amount: &str) -> Result<Run, String> {
    run_load_on(ports, hot, flag, amount, CONNECTIONS)
}

pub(crate) fn run_load_on(
    ports: &[u16],
    hot: bool,
    flag: &str,
    amount: &str,
    connections: usize,
) -> Result<Run, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let output = Command::new("taskset")
        .args(["-c", "1"])
        .arg(exe)
        .args(["load", "--ports", &ports])
        .args(["--subjects", if hot { "hot" } else { "many" }])
        .args([flag, amount])
        .args(["--connections", &connections.to_string()])
        .output()
        .map_err(|e| format!("the load generator: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let numbers: Vec<f64> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [requests, ok, limited, other, secs, p50, p99] = numbers[..] else {
        return Err(format!(
            "the load generator printed {text:?} ({})",
            String::from_utf8_lossy(&output.stderr)
        ));
    };
    Ok(Run {
        requests: requests as u64,
        ok: ok as u64,
        limited: limited as u64,
        other: other as u64,
        per_second: requests / secs,
        secs,
        p50,
        p99,
        buckets: lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect(),
        ..Run::default()
    })
}

/// A run, with the CPU seconds Redis and the instances spent in it.
pub(crate) fn measured_load(
    redis: &Redis,
    instances: &Instances,
    hot: bool,
    secs: f64,
    connections: usize,
) -> Result<Run, String> {
    let core0 = portcullis_tests::cpu::core_busy_seconds(0)?;
    let before = (redis.cpu()?, instances.cpu()?);
    let mut run = run_load_on(
        &instances.ports,
        hot,
        "--secs",
        &secs.to_string(),
        connections,
    )?;
    run.redis_cpu = redis.cpu()? - before.0;
    run.app_cpu = instances.cpu()? - before.1;
    run.core0_other =
        (portcullis_tests::cpu::core_busy_seconds(0)? - core0 - run.redis_cpu).max(0.0);
    Ok(run)
}

impl Run {
    /// Requests decided (admitted or limited) per CPU second of Redis, and
    /// of the three instances together; infinite under one clock tick.
    pub(crate) fn per_cpu_second(&self) -> (f64, f64) {
        let decided = (self.ok + self.limited) as f64;
        (decided / self.redis_cpu, decided / self.app_cpu)
    }

    /// `Redis 43% CPU (other work on its core 2%), instances 97% CPU`
    /// over the run's wall time.
    pub(crate) fn busy(&self) -> String {
        format!(
            "Redis {:.0}% CPU (other work on its core {:.0}%), instances {:.0}% CPU",
            100.0 * self.redis_cpu / self.secs,
            100.0 * self.core0_other / self.secs,
            100.0 * self.app_cpu / self.secs
        )
    }
}
