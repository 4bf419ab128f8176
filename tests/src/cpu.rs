//! CPU time of other processes, read from Linux's `/proc/<pid>/stat`: the
//! scale bench divides the checks decided in a round by the CPU seconds a
//! process spent in it (user and system time, all its threads), and reads
//! `/proc/stat` for how busy a core was with anything at all.

use std::process::Command;
use std::sync::OnceLock;

/// Clock ticks per second of `/proc/<pid>/stat`'s times (`getconf CLK_TCK`,
/// read once).
///
/// # Errors
///
/// When `getconf` does not run or prints no positive number.
pub fn clock_ticks() -> Result<u64, String> {
    static TICKS: OnceLock<Result<u64, String>> = OnceLock::new();
    TICKS
        .get_or_init(|| {
            let output = Command::new("getconf")
                .arg("CLK_TCK")
                .output()
                .map_err(|e| format!("getconf CLK_TCK: {e}"))?;
            let text = String::from_utf8_lossy(&output.stdout);
            match text.trim().parse::<u64>() {
                Ok(ticks) if ticks > 0 => Ok(ticks),
                _ => Err(format!("getconf CLK_TCK printed {text:?}")),
            }
        })
        .clone()
}

/// The process's name and its user plus system time in clock ticks, from
/// the text of `/proc/<pid>/stat`. The name (field 2) is in parentheses and
/// may itself hold spaces and parentheses, so the fields after it are
/// counted from the last `)`: `utime` and `stime` are fields 14 and 15.
///
/// # Errors
///
/// When the text is not a `stat` line.
pub fn parse_stat(text: &str) -> Result<(String, u64), String> {
    let open = text.find('(').ok_or("no '(' in the stat line")?;
    let close = text.rfind(')').ok_or("no ')' in the stat line")?;
    let name = text
        .get(open + 1..close)
        .ok_or("')' before '(' in the stat line")?
        .to_owned();
    // After the name: field 3 (state) is the first; utime is field 14.
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("field {n} of the stat line is missing or not a number"))
    };
    Ok((name, field(14)? + field(15)?))
}

/// CPU seconds (user plus system, every thread) that process `pid` has
/// spent so far, checking that it is the process named `name` (so a
/// wrapper such as `taskset` that did not exec is not measured instead).
/// The resolution is one clock tick (10 ms at 100 ticks per second).
///
/// # Errors
///
/// When the process is gone, is named otherwise, or its stat line does not
/// parse.
pub fn cpu_seconds(pid: u32, name: &str) -> Result<f64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let (found, ticks) = parse_stat(&text).map_err(|e| format!("{path}: {e}"))?;
    if found != name {
        return Err(format!("{path} names {found:?}, not {name:?}"));
    }
    Ok(ticks as f64 / clock_ticks()? as f64)
}

/// The busy time of core `core` in clock ticks, from the text of
/// `/proc/stat`: its `cpuN` line's user, nice, system, irq, softirq and
/// steal (not idle and iowait; guest time is already in user).
///
/// # Errors
///
/// When the text has no such line or it does not parse.
pub fn parse_core_busy(text: &str, core: usize) -> Result<u64, String> {
    let label = format!("cpu{core}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))
        .ok_or_else(|| format!("no {label} line in /proc/stat"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("/proc/stat's {label} line: {e}"))?;
    // user nice system idle iowait irq softirq steal ...
    let busy = [0, 1, 2, 5, 6, 7];
    busy.iter()
        .map(|&i| fields.get(i).copied())
        .sum::<Option<u64>>()
        .ok_or_else(|| format!("/proc/stat's {label} line is short"))
}

/// CPU seconds core `core` has been busy since boot, whatever ran on it
/// (every process, interrupts, and time the hypervisor took).
///
/// # Errors
///
/// When `/proc/stat` cannot be read or has no such core.
pub fn core_busy_seconds(core: usize) -> Result<f64, String> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    Ok(parse_core_busy(&text, core)? as f64 / clock_ticks()? as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_times_are_counted_from_the_last_parenthesis() {
        // A name with a space and a ')' of its own; utime 1234, stime 56.
        let line = "4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(line), Ok(("a) b".to_owned(), 1290)));
    }

    #[test]
    fn a_short_or_garbled_line_is_an_error() {
        assert!(parse_stat("4242 (x) S 1 2 3").is_err());
        assert!(parse_stat("4242 x S").is_err());
        assert!(parse_stat("4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 u 56").is_err());
    }

    #[test]
    fn a_core_is_busy_for_all_but_idle_and_iowait() {
        let stat = "cpu  9 9 9 9 9 9 9 9 0 0\n\
                    cpu0 1 2 4 1000 2000 8 16 32 64 0\n\
                    cpu1 100 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_core_busy(stat, 0), Ok(63));
        assert_eq!(parse_core_busy(stat, 1), Ok(100));
        assert!(parse_core_busy(stat, 2).is_err());
        assert!(parse_core_busy("cpu0 1 2 3\n", 0).is_err());
        assert!(core_busy_seconds(0).unwrap() >= 0.0);
    }

    #[test]
    fn this_process_is_read_and_checked_by_name() {
        let pid = std::process::id();
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (name, _) = parse_stat(&text).unwrap();
        assert!(cpu_seconds(pid, &name).unwrap() >= 0.0);
        assert!(cpu_seconds(pid, "not-this-process").is_err());
        assert!(clock_ticks().unwrap() > 0);
    }
}
