//! `BENCHMARKS.md` at the repository root: each benchmark run on the simulated cluster
//! rewrites its own `## ` section there and keeps everyone else's.

use std::path::PathBuf;

/// The machine and command, as every section describes them.
pub fn machine(command: &str) -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let memory_kib: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0.0);
    let output = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "- date: {}\n- commit: {}\n- CPUs: {}, {cpu}\n- memory: {:.1} GiB\n- kernel: {}\n- command: {command}\n",
        output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        output("git", &["rev-parse", "--short", "HEAD"]),
        std::thread::available_parallelism().map_or(0, usize::from),
        memory_kib / 1024.0 / 1024.0,
        read("/proc/version").split(" (").next().unwrap_or_default(),
    )
}

/// Replaces the section under `heading` (a `## ` line) with `body`, appending it when new.
pub fn write_section(heading: &str, body: &str) -> std::io::Result<PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .ok_or_else(|| std::io::Error::other("kube-sim-harness is not inside the workspace"))?
        .join("BENCHMARKS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, replace_section(&existing, heading, body))?;
    Ok(path)
}

/// `document` without the section whose heading line is exactly `heading` (to the next `## `
/// line), with `heading` and `body` appended. Only a whole line matches: `## csi-provisioner`
/// is not the start of `## csi-provisioner: the PV cache`.
fn replace_section(document: &str, heading: &str, body: &str) -> String {
    let mut kept = String::with_capacity(document.len());
    let mut skipping = false;
    for line in document.split_inclusive('\n') {
        if line.starts_with("## ") {
            skipping = line.trim_end() == heading;
        }
        if !skipping {
            kept.push_str(line);
        }
    }
    format!("{}\n\n{heading}\n\n{}\n", kept.trim_end(), body.trim_end())
}

/// The environment variable naming the directory of the release binaries to measure; `make
/// bench` sets it to where `make build` links them (`target/<host triple>/release`): a `cargo
/// bench` of a package with binaries rebuilds them, dynamically linked, into `target/release`.
const RELEASE_DIR_ENV: &str = "CSI_SUITE_RELEASE_DIR";

/// A release binary of the workspace: in `$CSI_SUITE_RELEASE_DIR` when set, else beside the
/// running benchmark's profile directory; the error says how to build it.
pub fn release_binary(name: &str, package: &str) -> std::io::Result<PathBuf> {
    let dir = match std::env::var_os(RELEASE_DIR_ENV) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::current_exe()?
            .parent()
            .and_then(std::path::Path::parent)
            .map(std::path::Path::to_path_buf),
    };
    let binary = dir
        .map(|dir| dir.join(name))
        .filter(|binary| binary.exists());
    binary.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{name} (package {package}) is missing: run `make build` first (make bench does; \
                 it links the release binaries statically, as BENCHMARKS.md measures them)"
            ),
        )
    })
}

/// A process's peak resident set (VmHWM), in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The CPU time a process has used so far, user and system (`/proc/<pid>/stat` utime + stime),
/// in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15; the first after ')' is field 3 (state).
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

#[cfg(test)]
mod tests {
    use super::replace_section;

    #[test]
    fn this_process_has_used_some_cpu() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        let seconds = super::cpu_seconds(std::process::id()).unwrap();
        assert!(seconds > 0.0 && seconds < 3600.0, "{seconds}");
    }

    #[test]
    fn a_section_is_replaced_by_its_whole_heading_line() {
        let document = "# Benchmarks\n\n## csi-provisioner: the PV cache\n\nkept\n\n\
                        ## csi-provisioner\n\nold\n\n## csi-attacher\n\nother\n";
        assert_eq!(
            replace_section(document, "## csi-provisioner", "new"),
            "# Benchmarks\n\n## csi-provisioner: the PV cache\n\nkept\n\n\
             ## csi-attacher\n\nother\n\n## csi-provisioner\n\nnew\n"
        );
    }

    #[test]
    fn a_new_section_is_appended() {
        assert_eq!(
            replace_section("# Benchmarks\n\n## a\n\nx\n", "## b", "y\n"),
            "# Benchmarks\n\n## a\n\nx\n\n## b\n\ny\n"
        );
        assert_eq!(replace_section("", "## b", "y"), "\n\n## b\n\ny\n");
    }
}
