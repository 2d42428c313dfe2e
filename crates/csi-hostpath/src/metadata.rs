//! The CSI SnapshotMetadata service (alpha): the allocated ranges of one snapshot
//! (GetMetadataAllocated) and the ranges that differ between two snapshots of one volume
//! (GetMetadataDelta), computed from the snapshots' image files (block and ext4 volumes; a
//! directory volume's snapshot is a tar archive without blocks: FAILED_PRECONDITION).
//!
//! - Tuples are VARIABLE_LENGTH, in every message of every stream: an image's extents are
//!   variable by nature, and a written gigabyte is one tuple, not 262 144 blocks.
//! - Allocated: the image's data extents (`SEEK_DATA`/`SEEK_HOLE`), what was written to the
//!   volume, zeros included; no data is read.
//! - Delta: the two images compared by content in [`BLOCK`]s, only where either holds data: a
//!   hole in both is unchanged without reading, data against a hole is compared with zeros, and
//!   a block rewritten with the same bytes is unchanged. Each compared byte is read once, a
//!   [`CHUNK`] at a time, and the changes found are streamed as the scan goes.
//! - `starting_offset`: the scan starts there (the seeks find the first extent from it, nothing
//!   before it is read); no tuple ends at or before it, the first of a delta may begin up to a
//!   block before it. An offset beyond the volume is OUT_OF_RANGE, one at its end answers
//!   nothing. `max_results` bounds every message (0: [`DEFAULT_MAX_RESULTS`]).
//! - A stream always has a message, empty when nothing is allocated or changed, so the client
//!   learns `volume_capacity_bytes`: the target snapshot's volume size.
//! - The scan runs on a thread of its own, at most [`MESSAGES_AHEAD`] messages ahead of the
//!   client; a client that goes away stops it within a chunk.
//! - The images are opened before the stream starts: a snapshot deleted meanwhile is unlinked
//!   but still read, so the stream completes with the snapshot as it was; its space is freed
//!   when the stream ends (or the client goes away).
//! - Each stream ends with a debug line counting its messages, tuples and image bytes read.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use csi::snapshot_metadata_server::SnapshotMetadata;
use csi_proto::csi::v1 as csi;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::error::DriverError;
use crate::rules::required;
use crate::sparse;
use crate::state::{Layout, Phase, Snapshot, State};

/// The style of every stream's tuples.
pub const BLOCK_METADATA_TYPE: csi::BlockMetadataType = csi::BlockMetadataType::VariableLength;

/// The unit a delta compares: its ranges begin on one and end on one (or at the volume's end).
pub const BLOCK: u64 = 4096;

/// Tuples per message when the request leaves `max_results` 0 (as upstream's hostpath driver).
pub const DEFAULT_MAX_RESULTS: usize = 256;

/// What a delta reads of each image at once.
pub const CHUNK: u64 = 1 << 20;

/// Messages computed ahead of the client.
pub const MESSAGES_AHEAD: usize = 4;

/// A delta that has read this much since its last message sends the tuples it has, so a long
/// scan finding little still reports as it goes.
const READ_BEFORE_PARTIAL_MESSAGE: u64 = 64 << 20;

/// What a stream reads, from a request checked against the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The snapshot whose allocation is listed, or the later one of a delta.
    pub target: String,
    /// The earlier snapshot of a delta.
    pub base: Option<String>,
    pub layout: Layout,
    /// The target snapshot's volume size: the end of every scan.
    pub capacity: u64,
    pub starting_offset: u64,
    pub max_results: usize,
}

pub fn plan_allocated(
    state: &State,
    request: &csi::GetMetadataAllocatedRequest,
) -> Result<Plan, DriverError> {
    let id = required(&request.snapshot_id, "snapshot_id")?;
    let (starting_offset, max_results) = window(request.starting_offset, request.max_results)?;
    let snapshot = ready_snapshot(state, id, "snapshot")?;
    plan(snapshot, None, starting_offset, max_results)
}

pub fn plan_delta(
    state: &State,
    request: &csi::GetMetadataDeltaRequest,
) -> Result<Plan, DriverError> {
    let base_id = required(&request.base_snapshot_id, "base_snapshot_id")?;
    let target_id = required(&request.target_snapshot_id, "target_snapshot_id")?;
    let (starting_offset, max_results) = window(request.starting_offset, request.max_results)?;
    let base = ready_snapshot(state, base_id, "base snapshot")?;
    let target = ready_snapshot(state, target_id, "target snapshot")?;
    if base.source_volume_id != target.source_volume_id {
        return Err(DriverError::SnapshotsOfDifferentVolumes {
            base: base.id.clone(),
            base_volume: base.source_volume_id.clone(),
            target: target.id.clone(),
            target_volume: target.source_volume_id.clone(),
        });
    }
    if target.created_unix_nanos < base.created_unix_nanos {
        return Err(DriverError::TargetBeforeBase {
            base: base.id.clone(),
            target: target.id.clone(),
        });
    }
    plan(target, Some(base), starting_offset, max_results)
}

/// `starting_offset` (OUT_OF_RANGE when negative, as the spec's tables say) and `max_results`.
fn window(starting_offset: i64, max_results: i32) -> Result<(u64, usize), DriverError> {
    let offset =
        u64::try_from(starting_offset).map_err(|_| DriverError::NegativeStartingOffset {
            offset: starting_offset,
        })?;
    let max = match max_results {
        0 => DEFAULT_MAX_RESULTS,
        n => usize::try_from(n).map_err(|_| DriverError::Negative {
            field: "max_results",
        })?,
    };
    Ok((offset, max))
}

/// A snapshot the CO may use (taken and not being deleted), or NOT_FOUND naming `kind`.
fn ready_snapshot<'a>(
    state: &'a State,
    id: &str,
    kind: &'static str,
) -> Result<&'a Snapshot, DriverError> {
    state
        .snapshots
        .get(id)
        .filter(|s| s.phase == Phase::Ready)
        .ok_or_else(|| DriverError::not_found(kind, id))
}

fn plan(
    target: &Snapshot,
    base: Option<&Snapshot>,
    starting_offset: u64,
    max_results: usize,
) -> Result<Plan, DriverError> {
    if let Some(snapshot) = base
        .into_iter()
        .chain([target])
        .find(|s| !s.layout().is_image())
    {
        return Err(DriverError::NoBlockMetadata {
            id: snapshot.id.clone(),
        });
    }
    if starting_offset > target.size_bytes {
        return Err(DriverError::StartingOffsetBeyondCapacity {
            offset: starting_offset,
            capacity: target.size_bytes,
        });
    }
    Ok(Plan {
        target: target.id.clone(),
        base: base.map(|s| s.id.clone()),
        layout: target.layout(),
        capacity: target.size_bytes,
        starting_offset,
        max_results,
    })
}

/// A file's data extents, asked for at positions that only move forward: an extent found once
/// answers every later question it covers, so a long extent costs two seeks however many
/// chunks it spans.
#[derive(Debug)]
struct DataCursor<'a> {
    file: &'a File,
    length: u64,
    found: Found,
}

#[derive(Debug)]
enum Found {
    Unknown,
    Extent(Range<u64>),
    /// Only holes follow.
    Exhausted,
}

impl<'a> DataCursor<'a> {
    fn new(file: &'a File, length: u64) -> Self {
        Self {
            file,
            length,
            found: Found::Unknown,
        }
    }

    /// The first extent holding data that ends after `at` (it may begin before `at`).
    fn after(&mut self, at: u64) -> io::Result<Option<Range<u64>>> {
        match &self.found {
            Found::Extent(extent) if extent.end > at => return Ok(Some(extent.clone())),
            Found::Exhausted => return Ok(None),
            _ => {}
        }
        let next = sparse::next_data_extent(self.file, at, self.length)?;
        self.found = next.clone().map_or(Found::Exhausted, Found::Extent);
        Ok(next)
    }
}

/// A scan of images, step by step, in ascending order of offsets.
pub trait Scan {
    /// Takes the next step, adding the ranges it finds (maybe none) to `found`; false when
    /// the scan is done.
    fn step(&mut self, found: &mut Vec<Range<u64>>) -> io::Result<bool>;
    /// Image bytes read so far.
    fn bytes_read(&self) -> u64;
}

/// The data extents of an image from `starting_offset` on, one per step.
#[derive(Debug)]
pub struct AllocatedScan<'a> {
    data: DataCursor<'a>,
    offset: u64,
}

impl<'a> AllocatedScan<'a> {
    /// Scans the first `length` bytes of `image` (its length, at most the volume's size).
    pub fn new(image: &'a File, length: u64, starting_offset: u64) -> Self {
        Self {
            data: DataCursor::new(image, length),
            offset: starting_offset,
        }
    }
}

impl Scan for AllocatedScan<'_> {
    fn step(&mut self, found: &mut Vec<Range<u64>>) -> io::Result<bool> {
        let Some(extent) = self.data.after(self.offset)? else {
            return Ok(false);
        };
        found.push(extent.start.max(self.offset)..extent.end);
        self.offset = extent.end;
        Ok(true)
    }

    fn bytes_read(&self) -> u64 {
        0
    }
}

/// One side of a delta: an image and the chunk of it last read.
#[derive(Debug)]
struct Side<'a> {
    data: DataCursor<'a>,
    buffer: Vec<u8>,
}

impl<'a> Side<'a> {
    fn new(image: &'a File, length: u64) -> Self {
        Self {
            data: DataCursor::new(image, length),
            buffer: vec![0; CHUNK as usize],
        }
    }

    /// Fills the buffer with `chunk` of the image, reading only its data extents (holes are
    /// zeros); returns the bytes read.
    fn load(&mut self, chunk: &Range<u64>) -> io::Result<u64> {
        let index = |at: u64| (at - chunk.start) as usize;
        let mut at = chunk.start;
        let mut read = 0;
        while at < chunk.end {
            let Some(extent) = self.data.after(at)?.filter(|e| e.start < chunk.end) else {
                break;
            };
            let (from, to) = (extent.start.max(at), extent.end.min(chunk.end));
            self.buffer[index(at)..index(from)].fill(0);
            read_or_zeros(
                self.data.file,
                &mut self.buffer[index(from)..index(to)],
                from,
            )?;
            read += to - from;
            at = to;
        }
        self.buffer[index(at)..index(chunk.end)].fill(0);
        Ok(read)
    }
}

/// Reads `buffer.len()` bytes at `offset`; what lies beyond the file's end reads as zeros.
fn read_or_zeros(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<()> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    buffer[filled..].fill(0);
    Ok(())
}

/// The blocks that differ between two images, a chunk per step, where either holds data.
#[derive(Debug)]
pub struct DeltaScan<'a> {
    base: Side<'a>,
    target: Side<'a>,
    offset: u64,
    end: u64,
    bytes_read: u64,
}

impl<'a> DeltaScan<'a> {
    /// Compares the images up to `end` (the volume's size); each length is its image's, at
    /// most `end`: beyond it an image reads as a hole.
    pub fn new(
        base: (&'a File, u64),
        target: (&'a File, u64),
        end: u64,
        starting_offset: u64,
    ) -> Self {
        Self {
            base: Side::new(base.0, base.1),
            target: Side::new(target.0, target.1),
            offset: starting_offset / BLOCK * BLOCK,
            end,
            bytes_read: 0,
        }
    }
}

impl Scan for DeltaScan<'_> {
    fn step(&mut self, found: &mut Vec<Range<u64>>) -> io::Result<bool> {
        if self.offset >= self.end {
            return Ok(false);
        }
        let next = [
            self.base.data.after(self.offset)?,
            self.target.data.after(self.offset)?,
        ]
        .into_iter()
        .flatten()
        .map(|extent| extent.start)
        .min();
        let Some(first) = next else {
            self.offset = self.end;
            return Ok(false);
        };
        let start = self.offset.max(first / BLOCK * BLOCK);
        let chunk = start..(start + CHUNK).min(self.end);
        self.bytes_read += self.base.load(&chunk)? + self.target.load(&chunk)?;
        let length = (chunk.end - chunk.start) as usize;
        changed_blocks(
            &self.base.buffer[..length],
            &self.target.buffer[..length],
            chunk.start,
            found,
        );
        self.offset = chunk.end;
        Ok(true)
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

/// Adds to `runs` the runs of [`BLOCK`]s that differ between two equally long buffers read
/// at `offset`.
pub fn changed_blocks(base: &[u8], target: &[u8], offset: u64, runs: &mut Vec<Range<u64>>) {
    let blocks = base
        .chunks(BLOCK as usize)
        .zip(target.chunks(BLOCK as usize));
    let mut at = offset;
    for (old, new) in blocks {
        let end = at + old.len() as u64;
        if old != new {
            match runs.last_mut() {
                Some(run) if run.end == at => run.end = end,
                _ => runs.push(at..end),
            }
        }
        at = end;
    }
}

/// Ranges in ascending order, adjacent ones joined, gathered into messages of at most `max`
/// tuples. A range is complete once a range that does not touch it follows.
#[derive(Debug)]
pub struct Batcher {
    max: usize,
    open: Option<Range<u64>>,
    complete: Vec<Range<u64>>,
}

impl Batcher {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            open: None,
            complete: Vec::new(),
        }
    }

    /// Adds the next range; returns a full message when there is one.
    pub fn push(&mut self, range: Range<u64>) -> Option<Vec<Range<u64>>> {
        if let Some(open) = &mut self.open
            && open.end == range.start
        {
            open.end = range.end;
            return None;
        }
        let done = self.open.replace(range)?;
        self.complete.push(done);
        (self.complete.len() >= self.max).then(|| std::mem::take(&mut self.complete))
    }

    /// The complete ranges not sent yet, if any.
    pub fn take_complete(&mut self) -> Option<Vec<Range<u64>>> {
        (!self.complete.is_empty()).then(|| std::mem::take(&mut self.complete))
    }

    /// Everything not sent yet: at most `max` ranges.
    pub fn finish(mut self) -> Vec<Range<u64>> {
        self.complete.extend(self.open);
        self.complete
    }
}

/// The two response messages, alike but for their type.
pub trait MetadataResponse: Send + 'static {
    const RPC: &'static str;
    fn new(volume_capacity_bytes: i64, block_metadata: Vec<csi::BlockMetadata>) -> Self;
}

/// Implements [`MetadataResponse`] for the response messages of the RPCs named.
macro_rules! metadata_responses {
    ($($response:ty => $rpc:literal),*) => {$(
        impl MetadataResponse for $response {
            const RPC: &'static str = $rpc;
            fn new(volume_capacity_bytes: i64, block_metadata: Vec<csi::BlockMetadata>) -> Self {
                Self {
                    block_metadata_type: BLOCK_METADATA_TYPE as i32,
                    volume_capacity_bytes,
                    block_metadata,
                }
            }
        }
    )*};
}

metadata_responses!(
    csi::GetMetadataAllocatedResponse => "GetMetadataAllocated",
    csi::GetMetadataDeltaResponse => "GetMetadataDelta"
);

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// The client went away.
    Cancelled,
    /// Reading an image failed; the client got INTERNAL.
    Failed,
}

/// What a stream sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub messages: u64,
    pub tuples: u64,
}

/// The messages of one stream, counted.
struct Messages<'a, T> {
    client: &'a mpsc::Sender<Result<T, Status>>,
    capacity: i64,
    sent: Sent,
}

impl<T: MetadataResponse> Messages<'_, T> {
    /// Sends a message of `ranges`; false when the client is gone.
    fn send(&mut self, ranges: Vec<Range<u64>>) -> bool {
        self.sent.messages += 1;
        self.sent.tuples += ranges.len() as u64;
        let tuples = ranges
            .into_iter()
            .map(|range| csi::BlockMetadata {
                byte_offset: i64::try_from(range.start).unwrap_or(i64::MAX),
                size_bytes: i64::try_from(range.end - range.start).unwrap_or(i64::MAX),
            })
            .collect();
        self.client
            .blocking_send(Ok(T::new(self.capacity, tuples)))
            .is_ok()
    }
}

/// Sends what `scan` finds to `client` as messages of at most `max_results` tuples.
pub fn pump<T: MetadataResponse>(
    scan: &mut dyn Scan,
    capacity: u64,
    max_results: usize,
    client: &mpsc::Sender<Result<T, Status>>,
) -> (Outcome, Sent) {
    let mut messages = Messages {
        client,
        capacity: i64::try_from(capacity).unwrap_or(i64::MAX),
        sent: Sent::default(),
    };
    let outcome = pump_into(scan, max_results, &mut messages);
    (outcome, messages.sent)
}

fn pump_into<T: MetadataResponse>(
    scan: &mut dyn Scan,
    max_results: usize,
    messages: &mut Messages<'_, T>,
) -> Outcome {
    let mut batcher = Batcher::new(max_results);
    let mut read_at_last_message = 0;
    let mut found = Vec::new();
    loop {
        if messages.client.is_closed() {
            return Outcome::Cancelled;
        }
        match scan.step(&mut found) {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => {
                let error = DriverError::io(format!("{}: reading a snapshot image", T::RPC), error);
                tracing::warn!(%error, "snapshot metadata stream failed");
                let _ = messages.client.blocking_send(Err(error.into()));
                return Outcome::Failed;
            }
        }
        for range in found.drain(..) {
            if let Some(message) = batcher.push(range) {
                if !messages.send(message) {
                    return Outcome::Cancelled;
                }
                read_at_last_message = scan.bytes_read();
            }
        }
        if scan.bytes_read() - read_at_last_message >= READ_BEFORE_PARTIAL_MESSAGE {
            read_at_last_message = scan.bytes_read();
            if let Some(message) = batcher.take_complete()
                && !messages.send(message)
            {
                return Outcome::Cancelled;
            }
        }
    }
    let last = batcher.finish();
    // A stream that found nothing still says the volume's size.
    if (!last.is_empty() || messages.sent.messages == 0) && !messages.send(last) {
        return Outcome::Cancelled;
    }
    Outcome::Completed
}

/// The images a stream reads, open before it starts.
#[derive(Debug)]
pub struct Images {
    pub plan: Plan,
    /// The target image and its length (at most the volume's size).
    pub target: (File, u64),
    pub base: Option<(File, u64)>,
}

impl Driver {
    /// Opens the images `plan` reads: from here on the stream reads these files, whatever
    /// happens to the snapshots.
    pub fn open_images(&self, plan: Plan) -> Result<Images, DriverError> {
        let open = |id: &str, kind: &'static str| {
            let path = self.store.snapshot_data(id, plan.layout);
            let opened = File::open(&path).and_then(|file| {
                let length = file.metadata()?.len().min(plan.capacity);
                Ok((file, length))
            });
            opened.map_err(|error| match error.kind() {
                // Deleted since the state was read.
                io::ErrorKind::NotFound => DriverError::not_found(kind, id),
                _ => DriverError::io(format!("opening {}", path.display()), error),
            })
        };
        let (target_kind, base_kind) = match plan.base {
            Some(_) => ("target snapshot", "base snapshot"),
            None => ("snapshot", "snapshot"),
        };
        let target = open(&plan.target, target_kind)?;
        let base = plan
            .base
            .as_deref()
            .map(|id| open(id, base_kind))
            .transpose()?;
        Ok(Images { plan, target, base })
    }
}

/// Streams what `images` hold, computed on a thread of the stream's own: one waiting for a
/// slow client holds no thread of the blocking pool the other RPCs need.
pub fn stream<T: MetadataResponse>(
    images: Images,
) -> Result<ReceiverStream<Result<T, Status>>, DriverError> {
    let (client, messages) = mpsc::channel(MESSAGES_AHEAD);
    std::thread::Builder::new()
        .name("snapshot-metadata".into())
        .spawn(move || serve::<T>(images, &client))
        .map_err(|error| DriverError::io(format!("starting a {} stream", T::RPC), error))?;
    Ok(ReceiverStream::new(messages))
}

fn serve<T: MetadataResponse>(images: Images, client: &mpsc::Sender<Result<T, Status>>) {
    let Images { plan, target, base } = images;
    let (target_file, target_length) = &target;
    let (mut allocated, mut delta);
    let scan: &mut dyn Scan = match &base {
        None => {
            allocated = AllocatedScan::new(target_file, *target_length, plan.starting_offset);
            &mut allocated
        }
        Some((base_file, base_length)) => {
            delta = DeltaScan::new(
                (base_file, *base_length),
                (target_file, *target_length),
                plan.capacity,
                plan.starting_offset,
            );
            &mut delta
        }
    };
    let (outcome, sent) = pump(scan, plan.capacity, plan.max_results, client);
    let bytes_read = scan.bytes_read();
    // Closed before the client sees the stream end.
    drop((target, base));
    tracing::debug!(
        rpc = T::RPC,
        snapshot = %plan.target,
        base = plan.base.as_deref().unwrap_or(""),
        starting_offset = plan.starting_offset,
        max_results = plan.max_results,
        ?outcome,
        messages = sent.messages,
        tuples = sent.tuples,
        bytes_read,
        "snapshot metadata stream ended"
    );
}

/// The SnapshotMetadata service over a shared [`Driver`].
#[derive(Debug, Clone)]
pub struct SnapshotMetadataService {
    driver: Arc<Driver>,
}

impl SnapshotMetadataService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }

    /// Checks `request` against the state, opens the images it reads and starts its stream.
    async fn start<R, T>(
        &self,
        request: Request<R>,
        plan: fn(&State, &R) -> Result<Plan, DriverError>,
    ) -> Result<Response<ReceiverStream<Result<T, Status>>>, Status>
    where
        R: Send + 'static,
        T: MetadataResponse,
    {
        let request = request.into_inner();
        let images = self
            .driver
            .blocking(move |d| {
                let state = d.store.read()?;
                d.open_images(plan(&state, &request)?)
            })
            .await?
            .into_inner();
        Ok(Response::new(stream(images)?))
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for SnapshotMetadataService {
    type GetMetadataAllocatedStream =
        ReceiverStream<Result<csi::GetMetadataAllocatedResponse, Status>>;
    type GetMetadataDeltaStream = ReceiverStream<Result<csi::GetMetadataDeltaResponse, Status>>;

    async fn get_metadata_allocated(
        &self,
        request: Request<csi::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        self.start(request, plan_allocated).await
    }

    async fn get_metadata_delta(
        &self,
        request: Request<csi::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        self.start(request, plan_delta).await
    }
}

#[cfg(test)]
// The tables' expected ranges are lists, of one range at times.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::state::{AccessType, Filesystem};
    use std::os::unix::fs::FileExt;
    use tonic::Code;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    type Ranges = Vec<Range<u64>>;

    fn snapshot(id: &str, volume: &str, created: u128) -> Snapshot {
        Snapshot {
            id: id.into(),
            name: format!("name-{id}"),
            source_volume_id: volume.into(),
            size_bytes: MIB,
            access_type: AccessType::Block,
            filesystem: None,
            phase: Phase::Ready,
            created_unix_nanos: created,
            group_snapshot_id: None,
            creator: None,
        }
    }

    fn state() -> State {
        let mut state = State::default();
        let mut add = |s: Snapshot| state.snapshots.insert(s.id.clone(), s);
        add(snapshot("s1", "vol-a", 1));
        add(snapshot("s2", "vol-a", 2));
        add(snapshot("other", "vol-b", 3));
        add(Snapshot {
            filesystem: Some(Filesystem::Ext4),
            access_type: AccessType::Mount,
            ..snapshot("ext4", "vol-c", 4)
        });
        add(Snapshot {
            access_type: AccessType::Mount,
            ..snapshot("dir", "vol-d", 5)
        });
        add(Snapshot {
            phase: Phase::Creating,
            ..snapshot("creating", "vol-a", 6)
        });
        add(Snapshot {
            phase: Phase::Deleting,
            ..snapshot("deleting", "vol-a", 7)
        });
        state
    }

    fn allocated(
        snapshot_id: &str,
        starting_offset: i64,
        max_results: i32,
    ) -> csi::GetMetadataAllocatedRequest {
        let snapshot_id = snapshot_id.to_string();
        csi::GetMetadataAllocatedRequest {
            snapshot_id,
            starting_offset,
            max_results,
            ..Default::default()
        }
    }

    fn delta(base: &str, target: &str, offset: i64, max: i32) -> csi::GetMetadataDeltaRequest {
        let (base_snapshot_id, target_snapshot_id) = (base.to_string(), target.to_string());
        csi::GetMetadataDeltaRequest {
            base_snapshot_id,
            target_snapshot_id,
            starting_offset: offset,
            max_results: max,
            ..Default::default()
        }
    }

    /// The code and message of a refusal, or the plan.
    fn outcome(planned: Result<Plan, DriverError>) -> Result<Plan, (Code, String)> {
        planned.map_err(|e| (e.code(), e.to_string()))
    }

    fn plan_of(target: &str, base: Option<&str>, layout: Layout, offset: u64, max: usize) -> Plan {
        Plan {
            target: target.into(),
            base: base.map(str::to_string),
            layout,
            capacity: MIB,
            starting_offset: offset,
            max_results: max,
        }
    }

    #[test]
    fn allocated_requests_are_checked_as_the_spec_says() {
        let state = state();
        let refused = |code, message: &str| Err((code, message.to_string()));
        let table = [
            (
                allocated("", 0, 0),
                refused(Code::InvalidArgument, "snapshot_id is required"),
            ),
            (
                allocated("s1", -1, 0),
                refused(Code::OutOfRange, "starting_offset -1 is negative"),
            ),
            (
                allocated("s1", 0, -5),
                refused(Code::InvalidArgument, "max_results must not be negative"),
            ),
            (
                allocated("nope", 0, 0),
                refused(Code::NotFound, "snapshot nope not found"),
            ),
            (
                allocated("creating", 0, 0),
                refused(Code::NotFound, "snapshot creating not found"),
            ),
            (
                allocated("deleting", 0, 0),
                refused(Code::NotFound, "snapshot deleting not found"),
            ),
            (
                allocated("dir", 0, 0),
                refused(
                    Code::FailedPrecondition,
                    "snapshot dir is of a directory volume (a tar archive, no blocks): snapshot metadata is served for block and ext4 volumes only; back it up in full",
                ),
            ),
            (
                allocated("s1", MIB as i64 + 1, 0),
                refused(
                    Code::OutOfRange,
                    "starting_offset 1048577 is beyond the snapshot's volume of 1048576 bytes",
                ),
            ),
            (
                allocated("s1", 0, 0),
                Ok(plan_of("s1", None, Layout::Image, 0, 256)),
            ),
            (
                allocated("s1", MIB as i64, 1),
                Ok(plan_of("s1", None, Layout::Image, MIB, 1)),
            ),
            (
                allocated("ext4", 4096, 7),
                Ok(plan_of("ext4", None, Layout::Ext4Image, 4096, 7)),
            ),
        ];
        for (request, want) in table {
            assert_eq!(
                outcome(plan_allocated(&state, &request)),
                want,
                "{request:?}"
            );
        }
    }

    #[test]
    fn delta_requests_are_checked_as_the_spec_says() {
        let state = state();
        let refused = |code, message: &str| Err((code, message.to_string()));
        let table = [
            (
                delta("", "s2", 0, 0),
                refused(Code::InvalidArgument, "base_snapshot_id is required"),
            ),
            (
                delta("s1", "", 0, 0),
                refused(Code::InvalidArgument, "target_snapshot_id is required"),
            ),
            (
                delta("s1", "s2", -4096, 0),
                refused(Code::OutOfRange, "starting_offset -4096 is negative"),
            ),
            (
                delta("s1", "s2", 0, i32::MIN),
                refused(Code::InvalidArgument, "max_results must not be negative"),
            ),
            (
                delta("nope", "s2", 0, 0),
                refused(Code::NotFound, "base snapshot nope not found"),
            ),
            (
                delta("s1", "nope", 0, 0),
                refused(Code::NotFound, "target snapshot nope not found"),
            ),
            (
                delta("s1", "other", 0, 0),
                refused(
                    Code::InvalidArgument,
                    "base snapshot s1 (of volume vol-a) and target snapshot other (of volume vol-b) are not snapshots of the same volume",
                ),
            ),
            (
                delta("s2", "s1", 0, 0),
                refused(
                    Code::InvalidArgument,
                    "target snapshot s1 was taken before base snapshot s2: the target is the later snapshot",
                ),
            ),
            (
                delta("s1", "s2", MIB as i64 + 1, 0),
                refused(
                    Code::OutOfRange,
                    "starting_offset 1048577 is beyond the snapshot's volume of 1048576 bytes",
                ),
            ),
            (
                delta("s1", "s2", 12345, 3),
                Ok(plan_of("s2", Some("s1"), Layout::Image, 12345, 3)),
            ),
            (
                delta("s1", "s1", 0, 0),
                Ok(plan_of("s1", Some("s1"), Layout::Image, 0, 256)),
            ),
        ];
        for (request, want) in table {
            assert_eq!(outcome(plan_delta(&state, &request)), want, "{request:?}");
        }
    }

    #[test]
    fn changed_blocks_are_joined_into_runs() {
        let b = BLOCK as usize;
        let zeros = vec![0u8; 4 * b];
        let with = |blocks: &[usize], tail: usize| {
            let mut buffer = vec![0u8; 4 * b + tail];
            for block in blocks {
                buffer[block * b + 7] = 1;
            }
            buffer
        };
        // Changed blocks of the target, a short tail, and the runs expected at offset 8 KiB.
        let table: [(&[usize], usize, Ranges); 5] = [
            (&[], 0, vec![]),
            (&[0], 0, vec![8 * KIB..12 * KIB]),
            (&[1, 2], 0, vec![12 * KIB..20 * KIB]),
            (&[0, 2, 3], 0, vec![8 * KIB..12 * KIB, 16 * KIB..24 * KIB]),
            // A last block shorter than BLOCK (the volume's end).
            (&[3, 4], 100, vec![20 * KIB..24 * KIB + 100]),
        ];
        for (blocks, tail, want) in table {
            let target = with(blocks, tail);
            let mut base = zeros.clone();
            base.resize(target.len(), 0);
            let mut runs = Vec::new();
            changed_blocks(&base, &target, 8 * KIB, &mut runs);
            assert_eq!(runs, want, "{blocks:?}");
        }
    }

    /// The messages a batcher makes of `ranges`, the last from `finish`.
    fn batches(max: usize, ranges: &[Range<u64>]) -> Vec<Vec<Range<u64>>> {
        let mut batcher = Batcher::new(max);
        let mut messages: Vec<_> = ranges
            .iter()
            .filter_map(|r| batcher.push(r.clone()))
            .collect();
        messages.push(batcher.finish());
        messages
    }

    #[test]
    fn batches_join_adjacent_ranges_and_hold_at_most_max() {
        let table: [(usize, Ranges, Vec<Ranges>); 4] = [
            (3, vec![], vec![vec![]]),
            (
                1,
                vec![0..4, 8..12, 16..20],
                vec![vec![0..4], vec![8..12], vec![16..20]],
            ),
            // Adjacent ranges (a run across chunks) are one tuple.
            (
                2,
                vec![0..4, 4..8, 8..12, 20..24],
                vec![vec![0..12, 20..24]],
            ),
            (
                2,
                vec![0..4, 8..12, 16..20, 20..30, 40..44],
                vec![vec![0..4, 8..12], vec![16..30, 40..44]],
            ),
        ];
        for (max, ranges, want) in table {
            let got = batches(max, &ranges);
            assert_eq!(got, want, "max {max}: {ranges:?}");
            assert!(got.iter().all(|m| m.len() <= max));
        }
    }

    /// A scan that yields prepared steps, each reading `read_per_step` bytes, and fails at
    /// the end when `fails`.
    struct Steps {
        steps: std::vec::IntoIter<Vec<Range<u64>>>,
        fails: bool,
        read_per_step: u64,
        read: u64,
    }

    impl Scan for Steps {
        fn step(&mut self, found: &mut Vec<Range<u64>>) -> io::Result<bool> {
            match self.steps.next() {
                Some(step) => {
                    found.extend(step);
                    self.read += self.read_per_step;
                    Ok(true)
                }
                None if self.fails => Err(io::Error::other("disk on fire")),
                None => Ok(false),
            }
        }
        fn bytes_read(&self) -> u64 {
            self.read
        }
    }

    fn steps(steps: Vec<Vec<Range<u64>>>, fails: bool) -> Steps {
        Steps {
            steps: steps.into_iter(),
            fails,
            read_per_step: 0,
            read: 0,
        }
    }

    type Received = Vec<Result<csi::GetMetadataDeltaResponse, Status>>;

    fn pumped(scan: &mut Steps, max: usize) -> ((Outcome, Sent), Received) {
        let (client, mut messages) = mpsc::channel(1000);
        let ended = pump(scan, 5 * MIB, max, &client);
        drop(client);
        let mut received = Vec::new();
        while let Ok(message) = messages.try_recv() {
            received.push(message);
        }
        (ended, received)
    }

    fn tuples(message: &csi::GetMetadataDeltaResponse) -> Vec<(i64, i64)> {
        message
            .block_metadata
            .iter()
            .map(|t| (t.byte_offset, t.size_bytes))
            .collect()
    }

    #[test]
    fn streams_split_at_max_results_and_always_say_the_capacity() {
        let found = vec![
            vec![0..4096],
            vec![],
            vec![8192..12288, 12288..16384, 20480..24576],
        ];
        // max_results, messages expected.
        type Tuples = Vec<(i64, i64)>;
        let table: [(usize, Vec<Tuples>); 3] = [
            (
                1,
                vec![vec![(0, 4096)], vec![(8192, 8192)], vec![(20480, 4096)]],
            ),
            (2, vec![vec![(0, 4096), (8192, 8192)], vec![(20480, 4096)]]),
            (256, vec![vec![(0, 4096), (8192, 8192), (20480, 4096)]]),
        ];
        for (max, want) in table {
            let ((outcome, sent), received) = pumped(&mut steps(found.clone(), false), max);
            assert_eq!(outcome, Outcome::Completed);
            let received: Vec<_> = received.into_iter().map(Result::unwrap).collect();
            assert_eq!(
                received.iter().map(tuples).collect::<Vec<_>>(),
                want,
                "max {max}"
            );
            assert_eq!(sent.messages, want.len() as u64);
            assert_eq!(sent.tuples, 3);
            for message in received {
                assert_eq!(message.volume_capacity_bytes, 5 * MIB as i64);
                assert_eq!(
                    message.block_metadata_type,
                    csi::BlockMetadataType::VariableLength as i32
                );
            }
        }
        // Nothing found: one empty message, which still tells the capacity.
        let ((outcome, _), received) = pumped(&mut steps(vec![vec![], vec![]], false), 0);
        assert_eq!(outcome, Outcome::Completed);
        let only = received.into_iter().map(Result::unwrap).collect::<Vec<_>>();
        assert_eq!(only.len(), 1);
        assert!(only[0].block_metadata.is_empty());
        assert_eq!(only[0].volume_capacity_bytes, 5 * MIB as i64);
    }

    #[test]
    fn a_long_scan_sends_its_complete_ranges_as_it_goes() {
        let found = (0..4).map(|i| vec![i * MIB..i * MIB + 4096]).collect();
        let mut slow = Steps {
            read_per_step: 32 * MIB,
            ..steps(found, false)
        };
        let ((outcome, _), received) = pumped(&mut slow, 256);
        assert_eq!(outcome, Outcome::Completed);
        let sizes = |at: u64| (at as i64, 4096);
        // After 64 MiB read: the range completed so far; after 128: the next two; then the
        // last, completed by the end of the scan.
        assert_eq!(
            received
                .iter()
                .map(|m| tuples(m.as_ref().unwrap()))
                .collect::<Vec<_>>(),
            [
                vec![sizes(0)],
                vec![sizes(MIB), sizes(2 * MIB)],
                vec![sizes(3 * MIB)]
            ]
        );
    }

    #[test]
    fn a_failing_read_ends_the_stream_with_internal_and_a_gone_client_stops_it() {
        let found = vec![vec![0..4096], vec![8192..12288]];
        let ((outcome, _), received) = pumped(&mut steps(found, true), 1);
        assert_eq!(outcome, Outcome::Failed);
        // The first range is complete once the second is found; the second could have grown.
        assert_eq!(received.len(), 2, "the complete range, then the error");
        assert_eq!(tuples(received[0].as_ref().unwrap()), [(0, 4096)]);
        let error = received[1].as_ref().unwrap_err();
        assert_eq!(error.code(), Code::Internal);
        assert_eq!(
            error.message(),
            "GetMetadataDelta: reading a snapshot image: disk on fire"
        );

        let (client, messages) = mpsc::channel::<Result<csi::GetMetadataDeltaResponse, Status>>(1);
        drop(messages);
        let mut endless = steps(vec![vec![0..4096]; 1000], false);
        let (outcome, sent) = pump(&mut endless, MIB, 1, &client);
        assert_eq!(outcome, Outcome::Cancelled);
        assert_eq!(sent.messages, 0);
        assert_eq!(endless.steps.len(), 1000, "not a step taken");
    }

    /// An image file of `length` bytes holding `pieces`, the rest holes.
    fn image(dir: &std::path::Path, name: &str, length: u64, pieces: &[(u64, Vec<u8>)]) -> File {
        let path = dir.join(name);
        let file = File::create(&path).unwrap();
        file.set_len(length).unwrap();
        for (at, bytes) in pieces {
            file.write_all_at(bytes, *at).unwrap();
        }
        file.sync_all().unwrap();
        File::open(&path).unwrap()
    }

    fn fill(at: u64, length: u64, byte: u8) -> (u64, Vec<u8>) {
        (at, vec![byte; length as usize])
    }

    /// Every range a scan finds, adjacent ones joined, as a stream sends them.
    fn run(scan: &mut dyn Scan) -> Vec<Range<u64>> {
        let mut batcher = Batcher::new(usize::MAX);
        let mut found = Vec::new();
        while scan.step(&mut found).unwrap() {
            for range in found.drain(..) {
                assert!(batcher.push(range).is_none());
            }
        }
        batcher.finish()
    }

    #[test]
    fn allocated_ranges_are_the_data_extents_from_the_starting_offset() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = image(
            dir.path(),
            "sparse",
            8 * MIB,
            &[
                fill(0, 4 * KIB, 1),
                fill(MIB, 64 * KIB, 2),
                // Zeros written are data: allocated.
                fill(3 * MIB, 8 * KIB, 0),
                fill(8 * MIB - 4 * KIB, 4 * KIB, 3),
            ],
        );
        let dense = image(dir.path(), "dense", 2 * MIB, &[fill(0, 2 * MIB, 9)]);
        let empty = image(dir.path(), "empty", 2 * MIB, &[]);
        // Image, its length for the scan, starting offset, ranges expected.
        let table: [(&File, u64, u64, Vec<Range<u64>>); 8] = [
            (
                &sparse,
                8 * MIB,
                0,
                vec![
                    0..4 * KIB,
                    MIB..MIB + 64 * KIB,
                    3 * MIB..3 * MIB + 8 * KIB,
                    8 * MIB - 4 * KIB..8 * MIB,
                ],
            ),
            // In the middle of an extent: it starts there.
            (
                &sparse,
                8 * MIB,
                MIB + 10_000,
                vec![
                    MIB + 10_000..MIB + 64 * KIB,
                    3 * MIB..3 * MIB + 8 * KIB,
                    8 * MIB - 4 * KIB..8 * MIB,
                ],
            ),
            // In a hole: the next extent.
            (&sparse, 8 * MIB, 5 * MIB, vec![8 * MIB - 4 * KIB..8 * MIB]),
            (&sparse, 8 * MIB, 8 * MIB, vec![]),
            // A length short of the file (its volume's size) cuts the scan.
            (
                &sparse,
                MIB + 4 * KIB,
                0,
                vec![0..4 * KIB, MIB..MIB + 4 * KIB],
            ),
            (&dense, 2 * MIB, 0, vec![0..2 * MIB]),
            (&dense, 2 * MIB, 4095, vec![4095..2 * MIB]),
            (&empty, 2 * MIB, 0, vec![]),
        ];
        for (file, length, offset, want) in table {
            let got = run(&mut AllocatedScan::new(file, length, offset));
            assert_eq!(got, want, "length {length}, from {offset}");
            assert!(
                got.iter().all(|r| r.end > offset),
                "nothing ends before the offset"
            );
        }
    }

    /// The changed ranges of two images read whole, block by block: the reference a delta
    /// must agree with.
    fn reference(base: &File, target: &File, end: u64) -> Vec<Range<u64>> {
        let read = |file: &File| {
            let mut bytes = vec![0; end as usize];
            read_or_zeros(file, &mut bytes, 0).unwrap();
            bytes
        };
        let mut runs = Vec::new();
        changed_blocks(&read(base), &read(target), 0, &mut runs);
        runs
    }

    fn allocated_bytes(file: &File, length: u64) -> u64 {
        sparse::data_extents(file, length)
            .unwrap()
            .iter()
            .map(|e| e.end - e.start)
            .sum()
    }

    #[test]
    fn deltas_compare_content_only_where_data_is() {
        let dir = tempfile::tempdir().unwrap();
        const SIZE: u64 = 6 * MIB;
        let base_pieces = vec![
            fill(0, 64 * KIB, 1),
            fill(MIB, 3 * MIB, 2),
            fill(5 * MIB, 4 * KIB, 3),
        ];
        let base = image(dir.path(), "base", SIZE, &base_pieces);
        let mut later = base_pieces.clone();
        later.extend([
            // The same bytes rewritten: unchanged.
            fill(0, 16 * KIB, 1),
            // Changed: one block, then a run across the 2 MiB chunk boundary.
            fill(MIB + 8 * KIB, 4 * KIB, 7),
            fill(2 * MIB - 4 * KIB, 12 * KIB, 7),
            // Zeros written where the base has a hole: unchanged.
            fill(4 * MIB + 64 * KIB, 8 * KIB, 0),
            // Data where the base has a hole: changed.
            fill(4 * MIB + 512 * KIB, 4 * KIB, 5),
            // Zeros over the base's data: changed.
            fill(5 * MIB, 4 * KIB, 0),
        ]);
        let target = image(dir.path(), "target", SIZE, &later);
        let changed = vec![
            MIB + 8 * KIB..MIB + 12 * KIB,
            2 * MIB - 4 * KIB..2 * MIB + 8 * KIB,
            4 * MIB + 512 * KIB..4 * MIB + 516 * KIB,
            5 * MIB..5 * MIB + 4 * KIB,
        ];
        assert_eq!(reference(&base, &target, SIZE), changed);
        // Dense images differing in a few bytes; an image grown since its base (expanded).
        let dense_base = image(dir.path(), "dense-base", 2 * MIB, &[fill(0, 2 * MIB, 4)]);
        let dense_target = image(
            dir.path(),
            "dense-target",
            2 * MIB,
            &[fill(0, 2 * MIB, 4), fill(MIB + 1, 1, 5)],
        );
        let grown = image(
            dir.path(),
            "grown",
            3 * MIB,
            &[fill(0, 2 * MIB, 4), fill(2 * MIB + 4 * KIB, 4 * KIB, 6)],
        );
        // Base, target, their lengths and the volume's end, starting offset, ranges expected.
        type Case<'a> = (&'a File, &'a File, (u64, u64, u64), u64, Vec<Range<u64>>);
        let table: [Case<'_>; 9] = [
            (&base, &target, (SIZE, SIZE, SIZE), 0, changed.clone()),
            (&base, &base, (SIZE, SIZE, SIZE), 0, vec![]),
            // From inside a changed block: the block (it begins before the offset).
            (
                &base,
                &target,
                (SIZE, SIZE, SIZE),
                MIB + 9 * KIB,
                changed.clone(),
            ),
            // From inside a run: from the block holding the offset.
            (
                &base,
                &target,
                (SIZE, SIZE, SIZE),
                2 * MIB + 1,
                vec![
                    2 * MIB..2 * MIB + 8 * KIB,
                    changed[2].clone(),
                    changed[3].clone(),
                ],
            ),
            (
                &base,
                &target,
                (SIZE, SIZE, SIZE),
                4 * MIB,
                changed[2..].to_vec(),
            ),
            (&base, &target, (SIZE, SIZE, SIZE), SIZE, vec![]),
            (
                &dense_base,
                &dense_target,
                (2 * MIB, 2 * MIB, 2 * MIB),
                0,
                vec![MIB..MIB + 4 * KIB],
            ),
            (
                &dense_base,
                &grown,
                (2 * MIB, 3 * MIB, 3 * MIB),
                0,
                vec![2 * MIB + 4 * KIB..2 * MIB + 8 * KIB],
            ),
            // A volume whose end is not block-aligned: the last range ends with it.
            (
                &dense_base,
                &dense_target,
                (MIB + 100, MIB + 100, MIB + 100),
                0,
                vec![MIB..MIB + 100],
            ),
        ];
        for (old, new, (old_length, new_length, end), offset, want) in table {
            let mut scan = DeltaScan::new((old, old_length), (new, new_length), end, offset);
            let got = run(&mut scan);
            assert_eq!(got, want, "from {offset} to {end}");
            assert!(
                got.iter().all(|r| r.end > offset),
                "nothing ends before the offset"
            );
            assert!(
                got.windows(2).all(|w| w[0].end < w[1].start),
                "ascending, apart"
            );
            // Holes in both are never read; data is read once.
            assert!(
                scan.bytes_read()
                    <= allocated_bytes(old, old_length) + allocated_bytes(new, new_length),
                "read {} bytes",
                scan.bytes_read()
            );
        }
        // A resumed delta reads nothing before its offset: here the 4 KiB each image holds
        // at 5 MiB, of the 3 MiB and more they hold before.
        let mut resumed = DeltaScan::new((&base, SIZE), (&target, SIZE), SIZE, 5 * MIB);
        run(&mut resumed);
        assert_eq!(resumed.bytes_read(), 8 * KIB);
    }
}
