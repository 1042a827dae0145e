//! The processes of a cluster must run one job: started with another seed, batch size,
//! input, epoch range or state, a process would place rows where the others do not look
//! for them, and rows would be duplicated or lost without a word (a seed that differed on
//! one of two processes delivered 7,136 of 20,000 rows twice and 7,136 never). So before
//! the dataflow starts, every process tells the others what it runs, and a difference is
//! an error naming the first option that differs.

use std::hash::{Hash, Hasher};

use hydrant_operators::{FeaturePlan, FittedState};

use super::cluster::Cluster;
use super::dataflow::Job;
use super::gather::gather;
use crate::delivery::Delivery;
use crate::error::{Error, Result};
use crate::source::Inputs;

/// The options of [`describe`] that may differ between two runs of one job: where a run
/// starts and ends, and how many threads it takes.
const RUN_OPTIONS: [&str; 4] = ["--epochs", "--start-epoch", "--start-step", "--workers"];

/// A fingerprint of the job `inputs` (`None`: pushed or followed input), `plan`, `state`
/// and `delivery` make: every option a cluster's processes compare but those of one run
/// (epochs, where it starts, workers). Two servers of one job give the same, in any
/// process of a build; a trainer that resumes names it (see `Served::job`).
pub fn job_fingerprint(
    (inputs, plan, state, delivery): (
        Option<&Inputs>,
        &FeaturePlan,
        Option<&FittedState>,
        &Delivery,
    ),
) -> u64 {
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    describe((inputs, plan, state, delivery), 0)
        .iter()
        .filter(|(what, _)| !RUN_OPTIONS.contains(what))
        .for_each(|entry| entry.hash(&mut hash));
    hash.finish()
}

/// What a process runs, option by option: `(what, value)`.
fn describe(
    (inputs, plan, state, d): (
        Option<&Inputs>,
        &FeaturePlan,
        Option<&FittedState>,
        &Delivery,
    ),
    workers: usize,
) -> Vec<(&'static str, String)> {
    let p = d.plan.placement();
    let columns: Vec<String> = plan
        .output_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    vec![
        ("pipeline output", columns.join(",")),
        (
            "pipeline (groups, steps and label)",
            format!("{:016x}", plan.fingerprint()),
        ),
        (
            "input",
            inputs.map_or("pushed or followed".into(), describe_input),
        ),
        (
            "state",
            state.map_or("fitted by the run".into(), |s| s.version.to_string()),
        ),
        ("--ranks", p.world_size().to_string()),
        ("--batch-size", p.batch_size().to_string()),
        ("--last-batch", format!("{:?}", p.last_batch())),
        (
            "--shuffle / --shuffle-window",
            match p.shuffled() {
                true => p.window().to_string(),
                false => "not shuffled".into(),
            },
        ),
        ("--seed", p.seed().to_string()),
        // Builds of other orders place the same options' rows elsewhere.
        (
            "order version",
            match inputs {
                Some(_) => crate::delivery::ORDER_VERSION,
                None => crate::delivery::STREAM_ORDER_VERSION,
            }
            .to_string(),
        ),
        ("--epochs", d.epochs.to_string()),
        ("--start-epoch", d.start_epoch.to_string()),
        ("--start-step", d.start_step.to_string()),
        ("--workers", workers.to_string()),
    ]
}

/// The input's units' rows, files' bytes and blocks of their contents, in input order,
/// not their paths: the same files may be mounted elsewhere on another machine. Rows
/// alone took other data of the same shape (another seed of the same generator, a stale
/// copy) as the same input, and its rows were delivered mixed with the others'; sizes
/// alone took the same files listed in another order (a glob sorted by another locale),
/// and some rows were delivered twice and others never. `DefaultHasher::new()` hashes
/// alike in every process of a build.
fn describe_input(inputs: &Inputs) -> String {
    let units = inputs.units();
    let mut sizes = std::collections::hash_map::DefaultHasher::new();
    units.iter().for_each(|u| u.rows.hash(&mut sizes));
    inputs.file_bytes().for_each(|b| b.hash(&mut sizes));
    inputs.file_samples().hash(&mut sizes);
    format!(
        "{} rows in {} units of {} bytes ({:016x})",
        units.iter().map(|u| u.rows).sum::<u64>(),
        units.len(),
        inputs.file_bytes().sum::<u64>(),
        sizes.finish()
    )
}

/// Fails, naming the first option that differs, unless every process of `cluster` runs
/// the same `job`.
pub(super) fn same_job(job: &Job, cluster: &Cluster) -> Result<()> {
    let job = (
        Some(&*job.inputs),
        &*job.plan,
        job.state.as_ref(),
        &job.delivery,
    );
    agree(cluster, describe(job, cluster.workers), String::new()).map(|_| ())
}

/// Fails, naming the first option that differs, unless every process of `cluster` serves
/// the same job (of `inputs`, `plan`, `state` and `delivery`) in the same way (`serving`:
/// the server's own options, `(what, value)`, such as who may read); otherwise returns
/// what each process says of itself (`own`: a server's location), process by process.
pub fn same_served(
    cluster: &Cluster,
    (inputs, plan, state, delivery): (&Inputs, &FeaturePlan, &FittedState, &Delivery),
    serving: Vec<(&'static str, String)>,
    own: String,
) -> Result<Vec<String>> {
    let mut mine = describe((Some(inputs), plan, Some(state), delivery), cluster.workers);
    mine.extend(serving);
    agree(cluster, mine, own)
}

/// Tells every process `mine` and `own`; fails on the first process whose `mine` differs,
/// else returns every process's `own`.
fn agree(cluster: &Cluster, mine: Vec<(&'static str, String)>, own: String) -> Result<Vec<String>> {
    let values: Vec<&String> = mine.iter().map(|(_, v)| v).collect();
    let said = serde_json::to_string(&(own, values))
        .map_err(|e| Error::Dataflow(format!("cannot describe the job: {e}")))?;
    let mut owns = Vec::with_capacity(cluster.processes);
    for (p, theirs) in gather(cluster, said)?.iter().enumerate() {
        let (their_own, theirs): (String, Vec<String>) =
            serde_json::from_str(theirs).unwrap_or_default();
        let differs = mine
            .iter()
            .zip(theirs.iter().map(Some).chain(std::iter::repeat(None)))
            .find(|((_, v), t)| Some(v) != *t);
        if let Some(((what, v), t)) = differs {
            return Err(Error::Usage(format!(
                "process {p} of the cluster runs another job: its {what} is {} where process \
                 {}'s is {v}; start every process with the same options and input",
                t.map_or("unknown", String::as_str),
                cluster.process
            )));
        }
        owns.push(their_own);
    }
    Ok(owns)
}
