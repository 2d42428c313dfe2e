//! The `process_*` families client_golang's process collector exports. The Go sidecars serve
//! them (component-base's legacy registry; livenessprobe only `process_start_time_seconds`),
//! so dashboards on `process_resident_memory_bytes` or `process_open_fds` keep working. Read
//! from procfs on every scrape; a file that cannot be read leaves its families out, as the Go
//! collector does.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::metrics::encode_as_upstream;

/// procfs' `userHZ`: the kernel reports times in 1/100 s to user space on every architecture.
const USER_HZ: f64 = 100.0;

/// Which families to serve, as the Go binary's registries hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessFamilies {
    /// client_golang's process collector in component-base's legacy registry: everything,
    /// with client_golang's help texts (csi-provisioner, whose metrics managers leave the
    /// start time out).
    All,
    /// The same, but `process_start_time_seconds` as csi-lib-utils' metrics manager registers
    /// it ("[ALPHA] " help): its registry is gathered first, so its copy wins (attacher,
    /// resizer, csi-snapshotter).
    AllWithManagerStartTime,
    /// Only the metrics manager's `process_start_time_seconds` (livenessprobe,
    /// snapshot-controller: no legacy registry).
    StartTime,
}

#[derive(Debug)]
pub struct ProcessCollector {
    families: ProcessFamilies,
}

impl ProcessCollector {
    pub fn new(families: ProcessFamilies) -> Self {
        Self { families }
    }
}

/// The figures `/proc/self/stat` gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatFigures {
    pub cpu_seconds: f64,
    pub virtual_memory_bytes: f64,
    pub resident_memory_bytes: f64,
    /// Needs `btime` from `/proc/stat` as well: without it only this figure is missing, as
    /// with procfs' `StartTime`.
    pub start_time_seconds: Option<f64>,
}

/// Parses `/proc/<pid>/stat` given `btime` from `/proc/stat` (if it could be read) and the
/// page size. The command name may hold spaces and parentheses, so fields are counted from
/// the last `)`.
pub fn parse_stat(stat: &str, boot_time: Option<f64>, page_size: f64) -> Option<StatFigures> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state); field N is at index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    let started_ticks = field(22)?;
    Some(StatFigures {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        start_time_seconds: boot_time.map(|boot_time| boot_time + started_ticks / USER_HZ),
        virtual_memory_bytes: field(23)?,
        resident_memory_bytes: field(24)? * page_size,
    })
}

/// `btime` (boot time, seconds since the epoch) from `/proc/stat`.
pub fn parse_boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft limit of `name` (e.g. `Max open files`) in `/proc/<pid>/limits`; `unlimited` is
/// the largest u64, as procfs reports it.
pub fn parse_soft_limit(limits: &str, name: &str) -> Option<f64> {
    let line = limits.lines().find(|line| line.starts_with(name))?;
    match line[name.len()..].split_whitespace().next()? {
        "unlimited" => Some(u64::MAX as f64),
        value => value.parse().ok(),
    }
}

/// `(InOctets, OutOctets)` of the `IpExt` table in `/proc/<pid>/net/netstat`: a header line
/// of names, then a line of values. A figure the file lacks is 0, as client_golang writes it.
pub fn parse_ip_octets(netstat: &str) -> (f64, f64) {
    let mut tables = netstat
        .lines()
        .filter_map(|line| line.strip_prefix("IpExt:"));
    let names: Vec<&str> = tables
        .next()
        .map(|names| names.split_whitespace().collect())
        .unwrap_or_default();
    let values: Vec<&str> = tables
        .next()
        .map(|values| values.split_whitespace().collect())
        .unwrap_or_default();
    let value = |wanted: &str| {
        names
            .iter()
            .position(|name| *name == wanted)
            .and_then(|at| values.get(at)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("InOctets"), value("OutOctets"))
}

/// The number of open descriptors as procfs counts them: since Linux 6.2 the size of the
/// `fd` directory is that number; on older kernels (size 0) the entries are counted, which
/// includes the descriptor the listing itself holds open.
fn open_fds() -> Option<f64> {
    let size = std::fs::metadata("/proc/self/fd").ok()?.len();
    if size > 0 {
        return Some(size as f64);
    }
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|fds| fds.count() as f64)
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn self_stat() -> Option<StatFigures> {
    let boot_time = read("/proc/stat").and_then(|proc_stat| parse_boot_time(&proc_stat));
    parse_stat(
        &read("/proc/self/stat")?,
        boot_time,
        rustix::param::page_size() as f64,
    )
}

/// One family of a scrape: a counter or a gauge with a single, unlabelled value.
struct Sample {
    name: &'static str,
    help: &'static str,
    counter: bool,
    value: f64,
}

/// Every family that could be read, in client_golang's order.
fn samples() -> Vec<Sample> {
    let stat = self_stat();
    let limits = read("/proc/self/limits");
    let limit = |name| limits.as_deref().and_then(|l| parse_soft_limit(l, name));
    let open_fds = open_fds();
    let octets = read("/proc/self/net/netstat").map(|text| parse_ip_octets(&text));
    let candidates = [
        (
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            true,
            stat.map(|s| s.cpu_seconds),
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            false,
            open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            false,
            limit("Max open files"),
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            false,
            stat.map(|s| s.virtual_memory_bytes),
        ),
        (
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            false,
            limit("Max address space"),
        ),
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            false,
            stat.map(|s| s.resident_memory_bytes),
        ),
        (
            START_TIME,
            START_TIME_HELP,
            false,
            stat.and_then(|s| s.start_time_seconds),
        ),
        (
            "process_network_receive_bytes",
            "Number of bytes received by the process over the network.",
            true,
            octets.map(|(received, _)| received),
        ),
        (
            "process_network_transmit_bytes",
            "Number of bytes sent by the process over the network.",
            true,
            octets.map(|(_, sent)| sent),
        ),
    ];
    candidates
        .into_iter()
        .filter_map(|(name, help, counter, value)| {
            value.map(|value| Sample {
                name,
                help,
                counter,
                value,
            })
        })
        .collect()
}

const START_TIME: &str = "process_start_time_seconds";
const START_TIME_HELP: &str = "Start time of the process since unix epoch in seconds.";
/// component-base's `processstarttime` help, as csi-lib-utils' metrics manager registers it.
const MANAGER_START_TIME_HELP: &str =
    "[ALPHA] Start time of the process since unix epoch in seconds.";

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let wanted = |sample: &Sample| match self.families {
            ProcessFamilies::All | ProcessFamilies::AllWithManagerStartTime => true,
            ProcessFamilies::StartTime => sample.name == START_TIME,
        };
        for mut sample in samples().into_iter().filter(wanted) {
            if sample.name == START_TIME && self.families != ProcessFamilies::All {
                sample.help = MANAGER_START_TIME_HELP;
            }
            let (name, help) = (sample.name, sample.help);
            if sample.counter {
                let counter = ConstCounter::new(sample.value);
                encode_as_upstream(&mut encoder, name, help, &counter)?;
            } else {
                let gauge = ConstGauge::new(sample.value);
                encode_as_upstream(&mut encoder, name, help, &gauge)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (csi (provisioner)) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                        250 130 0 0 20 0 9 0 123456 734003200 5120 18446744073709551615";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let figures = parse_stat(STAT, Some(1_700_000_000.0), 4096.0).unwrap();
        assert_eq!(
            figures,
            StatFigures {
                cpu_seconds: 3.8,
                virtual_memory_bytes: 734_003_200.0,
                resident_memory_bytes: 5120.0 * 4096.0,
                start_time_seconds: Some(1_700_000_000.0 + 1234.56),
            }
        );
        let without_boot_time = parse_stat(STAT, None, 4096.0).unwrap();
        assert_eq!(
            without_boot_time,
            StatFigures {
                start_time_seconds: None,
                ..figures
            }
        );
    }

    #[test]
    fn truncated_or_garbled_stat_gives_nothing() {
        for stat in [
            "",
            "4242 csi S 1",
            "4242 (csi) S 1 2 3",
            "4242 (csi) S x y z",
        ] {
            assert_eq!(parse_stat(stat, Some(0.0), 4096.0), None, "{stat:?}");
        }
    }

    #[test]
    fn boot_time_comes_from_btime() {
        let proc_stat = "cpu  1 2 3\nintr 5\nbtime 1764374400\nprocesses 9\n";
        assert_eq!(parse_boot_time(proc_stat), Some(1_764_374_400.0));
        assert_eq!(parse_boot_time("cpu 1 2 3\n"), None);
    }

    #[test]
    fn soft_limits_and_unlimited() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         unlimited            unlimited            bytes\n\
                      Max open files            1048576              1048576              files\n";
        let table: [(&str, Option<f64>); 3] = [
            ("Max open files", Some(1_048_576.0)),
            ("Max address space", Some(u64::MAX as f64)),
            ("Max locked memory", None),
        ];
        for (name, want) in table {
            assert_eq!(parse_soft_limit(limits, name), want, "{name}");
        }
    }

    #[test]
    fn ip_octets_come_from_the_ipext_table() {
        let netstat = "TcpExt: SyncookiesSent SyncookiesRecv\nTcpExt: 0 0\n\
                       IpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 91234 5678\n";
        assert_eq!(parse_ip_octets(netstat), (91_234.0, 5_678.0));
        let table = [
            "TcpExt: A\nTcpExt: 1\n",
            "",
            "IpExt: InNoRoutes\nIpExt: 0\n",
            "IpExt: InOctets OutOctets\n",
        ];
        for netstat in table {
            assert_eq!(parse_ip_octets(netstat), (0.0, 0.0), "{netstat:?}");
        }
    }

    #[test]
    fn a_scrape_of_this_process_has_the_go_families() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new(ProcessFamilies::All)));
        let text = super::super::encode(&registry);
        for family in [
            "process_cpu_seconds_total ",
            "process_open_fds ",
            "process_max_fds ",
            "process_virtual_memory_bytes ",
            "process_virtual_memory_max_bytes ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(family), "{family} missing from\n{text}");
        }
        let started: f64 = text
            .lines()
            .find_map(|line| line.strip_prefix("process_start_time_seconds "))
            .and_then(|value| value.parse().ok())
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "this test process cannot have started at {started} (now {now})"
        );

        assert!(
            text.contains("# HELP process_start_time_seconds Start time"),
            "{text}"
        );

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new(
            ProcessFamilies::AllWithManagerStartTime,
        )));
        let text = super::super::encode(&registry);
        assert!(text.contains("process_open_fds "), "{text}");
        assert!(
            text.contains("# HELP process_start_time_seconds [ALPHA] Start time"),
            "{text}"
        );

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new(ProcessFamilies::StartTime)));
        let text = super::super::encode(&registry);
        assert!(
            text.contains("# HELP process_start_time_seconds [ALPHA] Start time"),
            "{text}"
        );
        assert!(text.contains("process_start_time_seconds "), "{text}");
        assert!(!text.contains("process_open_fds"), "{text}");
    }
}
