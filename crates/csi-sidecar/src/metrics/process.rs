//! The `process_*` families client_golang's process collector exports. The Go sidecars serve
//! them (component-base's legacy registry; livenessprobe only `process_start_time_seconds`),
//! so dashboards on `process_resident_memory_bytes` or `process_open_fds` keep working. Read
//! from procfs on every scrape; a file that cannot be read leaves its families out, as the Go
//! collector does.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// procfs' `userHZ`: the kernel reports times in 1/100 s to user space on every architecture.
const USER_HZ: f64 = 100.0;

/// Which families to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessFamilies {
    /// Everything client_golang's process collector exports.
    All,
    /// Only `process_start_time_seconds` (csi-lib-utils' metrics manager on its own).
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
    pub start_time_seconds: f64,
}

/// Parses `/proc/<pid>/stat` given `btime` from `/proc/stat` and the page size. The command
/// name may hold spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(stat: &str, boot_time: f64, page_size: f64) -> Option<StatFigures> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state); field N is at index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(StatFigures {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        start_time_seconds: boot_time + field(22)? / USER_HZ,
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
/// of names, then a line of values.
pub fn parse_ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let mut tables = netstat
        .lines()
        .filter_map(|line| line.strip_prefix("IpExt:"));
    let names: Vec<&str> = tables.next()?.split_whitespace().collect();
    let values: Vec<&str> = tables.next()?.split_whitespace().collect();
    let value = |wanted: &str| {
        let at = names.iter().position(|name| *name == wanted)?;
        values.get(at)?.parse::<f64>().ok()
    };
    Some((
        value("InOctets").unwrap_or(0.0),
        value("OutOctets").unwrap_or(0.0),
    ))
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn self_stat() -> Option<StatFigures> {
    let boot_time = parse_boot_time(&read("/proc/stat")?)?;
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
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|fds| fds.count() as f64);
    let octets = read("/proc/self/net/netstat").and_then(|text| parse_ip_octets(&text));
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
            "Start time of the process since unix epoch in seconds.",
            false,
            stat.map(|s| s.start_time_seconds),
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

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let wanted = |sample: &Sample| match self.families {
            ProcessFamilies::All => true,
            ProcessFamilies::StartTime => sample.name == START_TIME,
        };
        for sample in samples().into_iter().filter(wanted) {
            if sample.counter {
                encode_family(&mut encoder, &sample, ConstCounter::new(sample.value))?;
            } else {
                encode_family(&mut encoder, &sample, ConstGauge::new(sample.value))?;
            }
        }
        Ok(())
    }
}

fn encode_family(
    encoder: &mut DescriptorEncoder,
    sample: &Sample,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(sample.name, sample.help, None, metric.metric_type())?;
    metric.encode(family)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (csi (provisioner)) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                        250 130 0 0 20 0 9 0 123456 734003200 5120 18446744073709551615";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let figures = parse_stat(STAT, 1_700_000_000.0, 4096.0).unwrap();
        assert_eq!(
            figures,
            StatFigures {
                cpu_seconds: 3.8,
                virtual_memory_bytes: 734_003_200.0,
                resident_memory_bytes: 5120.0 * 4096.0,
                start_time_seconds: 1_700_000_000.0 + 1234.56,
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
            assert_eq!(parse_stat(stat, 0.0, 4096.0), None, "{stat:?}");
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
        assert_eq!(parse_ip_octets(netstat), Some((91_234.0, 5_678.0)));
        assert_eq!(parse_ip_octets("TcpExt: A\nTcpExt: 1\n"), None);
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

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new(ProcessFamilies::StartTime)));
        let text = super::super::encode(&registry);
        assert!(text.contains("process_start_time_seconds "), "{text}");
        assert!(!text.contains("process_open_fds"), "{text}");
    }
}
