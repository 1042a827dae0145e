//! Statistics that follow a stream (`[stats] mode = "refresh"`).
//!
//! The first version is fitted on the first `warmup` rows (held until then), or given
//! with `--state`. From then on every admitted row is counted into mergeable statistics,
//! and every `every` rows — at stream rows `warmup + k * every`, its *refresh points* — a
//! new version is made from everything counted (decayed by row age with `decay`):
//! vocabularies only grow, so an id means the same value in every version; other
//! parameters are fitted anew. A version made at row `at` takes effect at the first row
//! at or after it where a step begins that no shuffle window crosses (a multiple of the
//! least common multiple of the step's rows and the window): every rank switches at the
//! same step, and each batch carries the version it was featurized with.
//!
//! Everything here is a function of the rows in stream order, so a restarted server
//! makes the same versions at the same rows. With a state directory each version is
//! written before any row uses it: its state (`state-VERSION.json`), the statistics as of
//! its refresh point (`stats-SEQ.json`, the latest only) and a line of `state.versions`.
//! A restarted server takes the versions from there and counts rows again from the last
//! refresh point, which is why a commit keeps the spool from that point on.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use hydrant_flight::ServeError;
use hydrant_operators::{FeaturePlan, FitPartial, FittedParam, FittedState, Fitter, Step};
use serde::{Deserialize, Serialize};

use super::run::lock;
use super::spool::state_error;
use crate::delivery::Placement;
use crate::error::{Error, Result};
use crate::spec::{PipelineSpec, StatsSpec};

mod count;
use count::Counter;

/// The versions' log in the state directory.
pub const VERSIONS_FILE: &str = "state.versions";

/// Versions the `state` action finds without a state directory (or in memory with one).
const KEPT: usize = 16;

/// A line of the versions' log.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    /// Which version this is: 0 for the first.
    seq: u64,
    /// Its state's version (what batches carry as `state_version`).
    version: u64,
    /// The stream row it was made at: it counts the rows before.
    at: u64,
    /// The stream row it takes effect at.
    from: u64,
}

/// The statistics as of a refresh point.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Snapshot {
    seq: u64,
    at: u64,
    statistics: FitPartial,
    /// Parameters whose statistics overflowed, no longer counted (see
    /// [`Refresh::keep_unfit`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    overflowed: Vec<String>,
}

/// A version of the state.
#[derive(Debug, Clone)]
pub(super) struct Version {
    line: Line,
    pub state: Arc<FittedState>,
}

/// Rows to featurize with one state.
pub(super) struct Piece {
    /// The stream row of its first row.
    pub first: u64,
    pub batch: RecordBatch,
    pub state: Arc<FittedState>,
}

/// A batch that [`Refresh::check`] found can be taken: where its rows start, how many,
/// and the warmup's trial statistics with them counted.
pub(super) struct Checked {
    first: u64,
    rows: usize,
    probe: Option<Fitter>,
}

/// The versions made so far, found by the `state` action and `status` without the
/// ingest lock (a producer may hold it while it waits for queue space).
#[derive(Default)]
pub(super) struct Known {
    /// The latest versions, oldest first.
    recent: VecDeque<Arc<FittedState>>,
    /// Where the others are, with a state directory.
    dir: Option<PathBuf>,
    /// Versions made, and the one the latest delivered rows use.
    pub made: u64,
    pub in_effect: u64,
}

impl Known {
    /// The state whose version is `version`, as JSON.
    pub fn json(&self, version: u64) -> Option<String> {
        if let Some(s) = self.recent.iter().find(|s| s.version == version) {
            return Some(s.to_json());
        }
        let path = self.dir.as_ref()?.join(state_file(version));
        hydrant_operators::read_small_text(&path, crate::pipeline::MAX_STATE_BYTES).ok()
    }

    fn add(&mut self, state: Arc<FittedState>) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(state);
        self.made += 1;
    }
}

/// A state's file name in the state directory.
fn state_file(version: u64) -> String {
    format!("state-{version}.json")
}

/// A snapshot's file name in the state directory.
fn snapshot_file(seq: u64) -> String {
    format!("stats-{seq}.json")
}

/// The stream's statistics and the versions made from them.
pub(super) struct Refresh {
    spec: StatsSpec,
    pipeline: String,
    /// What each version's parameters are fitted on (see `FittedState::chains`).
    chains: BTreeMap<String, String>,
    /// Counts the rows since the last refresh point.
    counter: Counter,
    /// Vocabularies that are full: no longer counted.
    full: Vec<String>,
    /// Parameters whose statistics overflowed: no longer counted either.
    overflowed: Vec<String>,
    /// Why no first version could be fitted: every later batch fails with it.
    unfit: Option<String>,
    /// Before the first version: the statistics that can overflow, of the warmup's rows
    /// counted so far, gathered as the counter gathers them (the same rows in the same
    /// slices, so that their sums come out the same); `None` once a version exists.
    probe: Option<Fitter>,
    /// The rows before it (decayed).
    total: FitPartial,
    /// Rows counted: those before are in `total` or `fitter`.
    counted: u64,
    /// The last refresh point (what `total` counts up to).
    last_at: u64,
    next_at: u64,
    /// Versions take effect at multiples of this.
    align: u64,
    /// The version in effect at the rows being admitted, then those waiting for their row.
    versions: VecDeque<Version>,
    /// Rows before the first version (without a given state), held until it is fitted.
    held: Vec<(u64, RecordBatch)>,
    log: Option<(PathBuf, File)>,
    pub known: Arc<Mutex<Known>>,
}

impl Refresh {
    /// Statistics for `plan` (`pipeline`'s, on its nominal schema), starting from `given`
    /// (`--state`) if there is one; versions take effect where `placement`'s steps and
    /// windows both begin. Every vocabulary needs a `max_size`: it is the index of unseen
    /// values in every version (a given state's vocabularies are made to agree).
    pub fn new(
        pipeline: &PipelineSpec,
        plan: Arc<FeaturePlan>,
        given: Option<FittedState>,
        placement: &Placement,
    ) -> Result<Self> {
        let spec = &pipeline.stats;
        let mut unknown = BTreeMap::new();
        for g in &pipeline.groups {
            for (at, step) in g.steps.iter().enumerate() {
                if let Step::Vocab { max_size, .. } = step {
                    let Some(max) = max_size else {
                        return Err(Error::Usage(format!(
                            "pipeline `{}`: group `{}` refreshes a vocabulary without \
                             max_size; give vocab(max_size=N) (N is then the unknown id in \
                             every version)",
                            pipeline.name, g.name
                        )));
                    };
                    for c in &g.columns {
                        unknown.insert(FittedState::key(&g.name, c, at), *max as u64);
                    }
                }
            }
        }
        let given = given.map(|s| with_unknown(s, &unknown));
        let pipeline = pipeline.name.clone();
        let usage = |why: String| Err(Error::Usage(format!("pipeline `{pipeline}`: {why}")));
        match plan.fit_passes() {
            0 => return usage("[stats] mode = \"refresh\", but no step is fitted".into()),
            1 => {}
            n => {
                return usage(format!(
                    "[stats] mode = \"refresh\" refits one fitted step per column; a chain \
                     here has {n}"
                ));
            }
        }
        let counter = Counter::start(plan.clone(), &pipeline)?;
        let probe = plan
            .fitter(0, &FittedState::empty(&pipeline))?
            .overflowing_only();
        let known = Arc::new(Mutex::new(Known::default()));
        let mut versions = VecDeque::new();
        if let Some(state) = given {
            let state = Arc::new(state);
            lock(&known).add(state.clone());
            versions.push_back(Version {
                line: Line {
                    seq: 0,
                    version: state.version,
                    at: 0,
                    from: 0,
                },
                state,
            });
        }
        Ok(Refresh {
            next_at: spec.warmup(),
            spec: spec.clone(),
            pipeline,
            chains: plan.fitted_chains(),
            counter,
            full: Vec::new(),
            overflowed: Vec::new(),
            unfit: None,
            probe: Some(probe),
            total: FitPartial::default(),
            counted: 0,
            last_at: 0,
            align: lcm(placement.step_rows(), placement.window()),
            versions,
            held: Vec::new(),
            log: None,
            known,
        })
    }

    /// The first stream row the statistics still need to count (a replay must start at
    /// or before it): the rows before are in the last refresh point's snapshot.
    pub fn counts_from(&self) -> u64 {
        self.last_at
    }

    /// Keeps versions in `dir`, and takes up what an earlier server kept there: its
    /// versions (those in effect from row `deliver_from` on are loaded) and its statistics
    /// as of its last refresh point. `replay_from` is the first row the input replays:
    /// rows between the snapshot and it would not be counted, so that is an error.
    pub fn keep_in(&mut self, dir: &Path, deliver_from: u64, replay_from: u64) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| state_error(dir, &e))?;
        let path = dir.join(VERSIONS_FILE);
        let (file, lines) = open_log(&path)?;
        lock(&self.known).dir = Some(dir.to_path_buf());
        self.log = Some((dir.to_path_buf(), file));
        let Some(last) = lines.last().copied() else {
            if replay_from > 0 {
                return Err(state_error(
                    &path,
                    &format!(
                        "no statistics were kept, but the input replays from row \
                         {replay_from} only: it was served frozen; start with an empty \
                         --state-dir to refresh"
                    ),
                ));
            }
            // A given state is the first version: written like any other.
            if let Some(v) = self.versions.front().cloned() {
                self.save(&v)?;
            }
            return Ok(());
        };
        if let Some(given) = self.versions.front()
            && lines[0].version != given.line.version
        {
            return Err(state_error(
                &path,
                &format!(
                    "its first version is {}, not --state's {}: give the same --state \
                     (or start with an empty --state-dir)",
                    lines[0].version, given.line.version
                ),
            ));
        }
        let snapshot_path = dir.join(snapshot_file(last.seq));
        let snapshot: Snapshot = match hydrant_operators::read_small_file(
            &snapshot_path,
            crate::pipeline::MAX_STATE_BYTES,
        ) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| state_error(&snapshot_path, &e))?
            }
            // The given state's line has no statistics: nothing was counted yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && last.seq == 0 && last.at == 0 => {
                Snapshot {
                    seq: 0,
                    at: 0,
                    statistics: FitPartial::default(),
                    overflowed: Vec::new(),
                }
            }
            Err(e) => return Err(state_error(&snapshot_path, &e)),
        };
        if snapshot.seq != last.seq || snapshot.at != last.at {
            return Err(state_error(&snapshot_path, &"it is not the last version's"));
        }
        if snapshot.at < replay_from {
            return Err(state_error(
                &snapshot_path,
                &format!(
                    "the statistics count rows up to {}, but the input replays from row \
                     {replay_from} only: rows are missing",
                    snapshot.at
                ),
            ));
        }
        // The versions in effect from `deliver_from` on: the last that starts at or before
        // it, and the later ones (a later line of the same row replaces an earlier one).
        let mut kept: Vec<Line> = Vec::new();
        for l in lines {
            if kept.last().is_some_and(|k| k.from == l.from) {
                kept.pop();
            }
            kept.push(l);
        }
        let first = kept
            .partition_point(|l| l.from <= deliver_from)
            .saturating_sub(1);
        self.versions.clear();
        let mut known = lock(&self.known);
        for line in &kept[first..] {
            let path = dir.join(state_file(line.version));
            let state = Arc::new(crate::read_state(&path)?);
            known.add(state.clone());
            self.versions.push_back(Version { line: *line, state });
        }
        known.made = last.seq + 1;
        drop(known);
        self.total = snapshot.statistics;
        self.counter.drop_statistics(snapshot.overflowed.clone())?;
        self.overflowed = snapshot.overflowed;
        if let Some(latest) = self.versions.back().map(|v| v.state.clone()) {
            self.stop_counting_full(&latest)?;
        }
        self.counted = last.at;
        self.last_at = last.at;
        // Refresh points are `warmup + k * every`; a given state's line is made at row 0.
        self.next_at = match last.at {
            0 => self.spec.warmup(),
            at => at + self.spec.every(),
        };
        Ok(())
    }

    /// Whether `batch`, whose rows start at stream row `first`, can be taken, changing
    /// nothing: the statistics can still be fitted, and within the warmup its values would
    /// not leave the first version unfit (refused whole, INVALID_ARGUMENT). A pushed batch
    /// is checked, then spooled, then [taken](Refresh::take): one that cannot be spooled
    /// (a full disk) is never counted.
    pub fn check(
        &self,
        batch: &RecordBatch,
        first: u64,
    ) -> std::result::Result<Checked, ServeError> {
        if let Some(why) = &self.unfit {
            return Err(ServeError::FailedPrecondition(why.clone()));
        }
        Ok(Checked {
            first,
            rows: batch.num_rows(),
            probe: self.check_warmup(batch, first)?,
        })
    }

    /// Takes `batch`, whose rows start at stream row `first`, as [`Refresh::check`] found
    /// it: counts the rows not counted yet, makes the versions whose refresh points it
    /// passes, and returns its rows from `deliver_from` on cut where the state changes
    /// (with the rows held for the first version, when this batch completes its warmup).
    /// Rows before the first version are held, not returned.
    pub fn take(
        &mut self,
        batch: &RecordBatch,
        checked: Checked,
        deliver_from: u64,
    ) -> std::result::Result<Vec<Piece>, ServeError> {
        let first = checked.first;
        if checked.rows != batch.num_rows() {
            return Err(internal(format!(
                "a batch of {} rows taken as checked with {}",
                batch.num_rows(),
                checked.rows
            )));
        }
        // Rows held from `first` on were taken before and are taken again now (a replay
        // from the spool that starts before the rows counted).
        self.held.retain(|(pos, _)| *pos < first);
        if !self.versions.is_empty() {
            self.probe = None;
        } else if let Some(probe) = checked.probe {
            self.probe = Some(probe);
        }
        let mut out = Vec::new();
        let end = first + batch.num_rows() as u64;
        let mut pos = first;
        if self.counted < first {
            // `keep_in` refuses a replay that starts past the statistics' row: a bug.
            return Err(internal(format!(
                "stream rows {}..{first} were never counted into the statistics",
                self.counted
            )));
        }
        loop {
            if pos == self.next_at && self.counted == pos {
                self.refresh(deliver_from, &mut out)?;
            }
            if pos == end {
                return Ok(out);
            }
            while self.versions.get(1).is_some_and(|v| v.line.from <= pos) {
                self.versions.pop_front();
            }
            let mut to = end;
            if self.counted > pos {
                to = to.min(self.counted);
            } else {
                to = to.min(self.next_at);
            }
            if let Some(next) = self.versions.get(1) {
                to = to.min(next.line.from);
            }
            let slice = batch.slice((pos - first) as usize, (to - pos) as usize);
            if pos >= self.counted {
                self.counter.count(slice.clone()).map_err(internal)?;
                self.counted = to;
            }
            match self.versions.front() {
                None => self.held.push((pos, slice)),
                Some(v) => {
                    lock(&self.known).in_effect = v.state.version;
                    push_from(&mut out, deliver_from, pos, slice, &v.state);
                }
            }
            pos = to;
        }
    }

    /// Refuses `batch` (rows from `first`) whole if, before the first version, its numbers
    /// would leave that version unfit: values so large that their moments overflow. Its
    /// rows are not acknowledged then, where a first version that cannot be fitted would
    /// fail the stream (no version before to keep) and the rows already taken would fail
    /// it again at every restart that replays them. The statistics that can overflow are
    /// gathered here a second time, beside the counter, for the warmup's rows only.
    /// The warmup's trial statistics with `batch`'s warmup rows counted (`None`: it has
    /// none not counted yet, or a version exists), or why they could not be fitted.
    fn check_warmup(&self, batch: &RecordBatch, first: u64) -> Result<Option<Fitter>, ServeError> {
        // Rows counted already (a batch taken again) were checked when first taken.
        let from = first.max(self.counted);
        let to = (first + batch.num_rows() as u64).min(self.spec.warmup());
        let unversioned = self.versions.is_empty();
        let Some(probe) = self.probe.as_ref().filter(|_| unversioned && from < to) else {
            return Ok(None);
        };
        let rows = batch.slice((from - first) as usize, (to - from) as usize);
        let mut trial = probe.clone();
        trial.update(&rows).map_err(internal)?;
        let mut params = BTreeMap::new();
        let counted = trial.clone().into_partial().map_err(internal)?;
        counted.finish_after(&FittedState::empty(&self.pipeline), &mut params);
        for (key, param) in &params {
            if let Err(e) = FittedState::check_param(key, param) {
                let why = self.unfit_why(to, &e);
                return Err(ServeError::InvalidArgument(format!(
                    "{why}; nothing of this batch was taken"
                )));
            }
        }
        Ok(Some(trial))
    }

    /// Why the statistics of stream rows `0..at` cannot be fitted (`e`, of a parameter).
    fn unfit_why(&self, at: u64, e: &dyn std::fmt::Display) -> String {
        format!(
            "pipeline `{}`: the statistics of stream rows 0..{at} cannot be fitted: {e} \
             (values too large to fit: clip or rescale them)",
            self.pipeline
        )
    }

    /// The input ended: without a version yet, the first is fitted on the rows held.
    /// Returns them, as [`Refresh::take`] does.
    pub fn finish(&mut self, deliver_from: u64) -> std::result::Result<Vec<Piece>, ServeError> {
        let mut out = Vec::new();
        if self.versions.is_empty() && !self.held.is_empty() {
            self.refresh(deliver_from, &mut out)?;
        }
        Ok(out)
    }

    /// Makes a version from the rows counted so far (at refresh point `counted`).
    fn refresh(
        &mut self,
        deliver_from: u64,
        out: &mut Vec<Piece>,
    ) -> std::result::Result<(), ServeError> {
        let at = self.counted;
        let chunk = self.counter.cut().map_err(internal)?;
        if let Some(half_life) = self.spec.decay {
            self.total
                .decay(0.5f64.powf((at - self.last_at) as f64 / half_life));
        }
        self.total.merge(chunk);
        self.total.collapse();
        let empty = Arc::new(FittedState::empty(&self.pipeline));
        let prev = self.versions.back().map_or(empty, |v| v.state.clone());
        let mut params = BTreeMap::new();
        self.total.clone().finish_after(&prev, &mut params);
        self.keep_unfit(&prev, &mut params, at)?;
        let state =
            Arc::new(FittedState::new(&self.pipeline, params).with_chains(self.chains.clone()));
        let first = self.versions.is_empty();
        let seq = lock(&self.known).made;
        let version = Version {
            line: Line {
                seq,
                version: state.version,
                at,
                // The first version featurizes the rows it was fitted on.
                from: if first {
                    0
                } else {
                    at.div_ceil(self.align).saturating_mul(self.align)
                },
            },
            state: state.clone(),
        };
        // Full vocabularies are not counted on (nor kept in the statistics written).
        self.stop_counting_full(&state).map_err(internal)?;
        // Written before any row uses it.
        self.save(&version).map_err(internal)?;
        lock(&self.known).add(state.clone());
        metrics::counter!(crate::metrics::STATE_VERSIONS).increment(1);
        self.last_at = at;
        self.next_at = at + self.spec.every();
        if self
            .versions
            .back()
            .is_some_and(|v| v.line.from == version.line.from)
        {
            self.versions.pop_back();
        }
        self.versions.push_back(version);
        if first {
            lock(&self.known).in_effect = state.version;
            for (pos, batch) in std::mem::take(&mut self.held) {
                push_from(out, deliver_from, pos, batch, &state);
            }
        }
        Ok(())
    }

    /// Keeps `prev`'s value of each parameter in `params` that the statistics can no
    /// longer give: values so large that their moments overflow (one row of 1e200 makes a
    /// variance infinite, and it stays so, as every row so far counts). Such a parameter is
    /// no longer counted, as a full vocabulary is not, so later versions keep it too and
    /// nothing infinite is written (JSON has no infinity: a state directory holding one
    /// could not be read again). Without a version before, the stream cannot go on: this
    /// batch and every later one fail with why, as `hydrant fit` refuses such data.
    fn keep_unfit(
        &mut self,
        prev: &FittedState,
        params: &mut BTreeMap<String, FittedParam>,
        at: u64,
    ) -> std::result::Result<(), ServeError> {
        let unfit: Vec<(String, String)> = params
            .iter()
            .filter_map(|(k, p)| {
                let e = FittedState::check_param(k, p).err()?;
                Some((k.clone(), e.to_string()))
            })
            .collect();
        let mut keys = Vec::new();
        for (key, why) in unfit {
            let why = self.unfit_why(at, &why);
            let Some(kept) = prev.params.get(&key) else {
                self.unfit = Some(why.clone());
                return Err(ServeError::FailedPrecondition(why));
            };
            hydrant_operators::log_line!(
                "hydrant: {why}; it stays as in version {} from now on",
                prev.version
            );
            metrics::counter!(crate::metrics::STATS_OVERFLOWED).increment(1);
            params.insert(key.clone(), kept.clone());
            keys.push(key);
        }
        if !keys.is_empty() {
            self.total.drop_statistics(&keys);
            self.counter
                .drop_statistics(keys.clone())
                .map_err(internal)?;
            self.overflowed.extend(keys);
        }
        Ok(())
    }

    /// Stops counting the values of vocabularies `state` has filled: they take no more
    /// values, so their counts would only grow memory (every distinct value) and time.
    /// Rows counted from now on do not count them; the next versions keep them as they are.
    fn stop_counting_full(&mut self, state: &FittedState) -> Result<()> {
        let full: Vec<String> = state
            .params
            .iter()
            .filter(|(k, p)| {
                matches!(p, FittedParam::BoundedVocab { values, unknown }
                    if values.len() as u64 >= *unknown && !self.full.contains(*k))
            })
            .map(|(k, _)| k.clone())
            .collect();
        if full.is_empty() {
            return Ok(());
        }
        self.total.drop_statistics(&full);
        self.counter.drop_statistics(full.clone())?;
        self.full.extend(full);
        Ok(())
    }

    /// Writes `v` to the state directory, if there is one: its state and statistics
    /// (synced), then its line.
    fn save(&mut self, v: &Version) -> Result<()> {
        let Some((dir, log)) = &mut self.log else {
            return Ok(());
        };
        let state_path = dir.join(state_file(v.line.version));
        write_synced(&state_path, v.state.to_json().as_bytes())?;
        if v.line.seq > 0 || v.line.at > 0 {
            let path = dir.join(snapshot_file(v.line.seq));
            let snapshot = Snapshot {
                seq: v.line.seq,
                at: v.line.at,
                statistics: self.total.clone(),
                overflowed: self.overflowed.clone(),
            };
            let json = serde_json::to_vec(&snapshot).map_err(|e| state_error(&path, &e))?;
            write_synced(&path, &json)?;
        }
        let path = dir.join(VERSIONS_FILE);
        let mut line = serde_json::to_string(&v.line).map_err(|e| state_error(&path, &e))?;
        line.push('\n');
        log.write_all(line.as_bytes())
            .and_then(|()| log.sync_data())
            .map_err(|e| state_error(&path, &e))?;
        // Only the last snapshot is read back.
        for seq in v.line.seq.saturating_sub(2)..v.line.seq {
            let _ = std::fs::remove_file(dir.join(snapshot_file(seq)));
        }
        Ok(())
    }
}

/// `state` with each vocabulary's unknown index set as `unknown` (by parameter key) says;
/// its version changes with it.
fn with_unknown(state: FittedState, unknown: &BTreeMap<String, u64>) -> FittedState {
    let mut params = state.params;
    for (key, param) in params.iter_mut() {
        if let (Some((values, _)), Some(&max)) = (param.vocabulary(), unknown.get(key)) {
            *param = FittedParam::BoundedVocab {
                values: values.clone(),
                unknown: max,
            };
        }
    }
    FittedState::new(&state.pipeline, params).with_chains(state.chains)
}

/// Appends the part of `batch` (rows from `pos`) at or after `deliver_from` to `out`.
fn push_from(
    out: &mut Vec<Piece>,
    deliver_from: u64,
    pos: u64,
    batch: RecordBatch,
    state: &Arc<FittedState>,
) {
    let end = pos + batch.num_rows() as u64;
    if end <= deliver_from || batch.num_rows() == 0 {
        return;
    }
    let skip = deliver_from.saturating_sub(pos);
    out.push(Piece {
        first: pos + skip,
        batch: batch.slice(skip as usize, (end - pos - skip) as usize),
        state: state.clone(),
    });
}

/// Opens the versions' log (creating it), cuts off a torn last line and returns its lines.
fn open_log(path: &Path) -> Result<(File, Vec<Line>)> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| state_error(path, &e))?;
    let mut lines = Vec::new();
    let mut whole = 0u64;
    let mut reader = std::io::BufReader::new(&file);
    let mut text = String::new();
    loop {
        text.clear();
        let n = reader
            .read_line(&mut text)
            .map_err(|e| state_error(path, &e))?;
        if n == 0 || !text.ends_with('\n') {
            break;
        }
        let line: Line = serde_json::from_str(&text)
            .map_err(|e| state_error(path, &format!("line {}: {e}", lines.len() + 1)))?;
        lines.push(line);
        whole += n as u64;
    }
    if whole < file.metadata().map_err(|e| state_error(path, &e))?.len() {
        file.set_len(whole).map_err(|e| state_error(path, &e))?;
        file.sync_all().map_err(|e| state_error(path, &e))?;
    }
    Ok((file, lines))
}

/// Writes `bytes` to `path` atomically (see `spool::write_synced`).
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    super::spool::write_synced(path, bytes).map_err(|e| state_error(path, &e))
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a.max(1), b.max(1));
    while y != 0 {
        (x, y) = (y, x % y);
    }
    (a.max(1) / x).saturating_mul(b.max(1))
}

fn internal(e: impl std::fmt::Display) -> ServeError {
    ServeError::Internal(e.to_string())
}

#[cfg(test)]
mod tests;
