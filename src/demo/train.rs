//! A small data-parallel logistic regression, to show training fed by loaders while the
//! dataflow keeps featurizing: one trainer thread per rank, each step's gradients averaged
//! across ranks before one shared update (an all-reduce in miniature).
//!
//! The model is `sigmoid(w·dense + Σ_k v[hash(k, id_k)] + b)`, trained with AdaGrad;
//! padding rows are masked out of the loss and the gradients.

use std::sync::{Barrier, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::loader::{Loader, TrainingBatch};

/// Training settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    /// AdaGrad learning rate.
    pub learning_rate: f32,
    /// Weights the id features are hashed into.
    pub id_buckets: usize,
    /// Extra time each step takes, standing in for a bigger model's compute.
    pub step_time: Duration,
    /// Print the loss every this many steps to stderr (0: never).
    pub log_every: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            learning_rate: 0.05,
            id_buckets: 1 << 20,
            step_time: Duration::ZERO,
            log_every: 0,
        }
    }
}

/// What training did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainReport {
    /// Global steps taken (each with every rank).
    pub steps: u64,
    /// Mean logloss over the real rows of each step, in order.
    pub losses: Vec<f64>,
    /// Real rows trained on.
    pub rows: u64,
}

struct Model {
    dense: Vec<f32>,
    ids: Vec<f32>,
    bias: f32,
    // AdaGrad accumulators.
    g_dense: Vec<f32>,
    g_ids: Vec<f32>,
    g_bias: f32,
}

/// One step's summed gradients from every rank.
#[derive(Default)]
struct Reduced {
    dense: Vec<f32>,
    ids: Vec<(usize, f32)>,
    bias: f32,
    loss: f64,
    rows: u64,
    /// Set by a rank whose stream ended (empty) or failed (the error).
    stop: Option<String>,
    /// The leader's decision for the step just reduced: stop, and why. Separate from
    /// `stop`, which a fast rank may already be setting for the next step.
    decided: Option<String>,
}

/// Trains on `loaders` (one per rank) until their batches run out.
pub fn train(loaders: &[Loader], config: TrainConfig) -> Result<TrainReport> {
    let ranks = loaders.len();
    let model = RwLock::new(None::<Model>);
    let reduced = Mutex::new(Reduced::default());
    let report = Mutex::new(TrainReport::default());
    let barrier = Barrier::new(ranks);
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = loaders
            .iter()
            .map(|loader| {
                let (model, reduced, report, barrier) = (&model, &reduced, &report, &barrier);
                s.spawn(move || {
                    let mut local = Reduced::default();
                    loop {
                        local.stop = None;
                        match loader.next_batch() {
                            Some(Ok(batch)) => {
                                init(model, &batch, &config);
                                let m = model.read().unwrap_or_else(|p| p.into_inner());
                                let m = m.as_ref().expect("initialized above");
                                gradients(m, &batch, &config, &mut local);
                                std::thread::sleep(config.step_time);
                            }
                            Some(Err(e)) => local.stop = Some(e.to_string()),
                            None => local.stop = Some(String::new()),
                        }
                        // All-reduce: sum into the shared buffer, wait for every rank.
                        {
                            let mut r = reduced.lock().unwrap_or_else(|p| p.into_inner());
                            r.add(&mut local);
                        }
                        if barrier.wait().is_leader() {
                            let mut r = reduced.lock().unwrap_or_else(|p| p.into_inner());
                            if r.stop.is_none() {
                                let mut m = model.write().unwrap_or_else(|p| p.into_inner());
                                if let Some(m) = m.as_mut() {
                                    apply(m, &r, config.learning_rate);
                                }
                                let mut rep = report.lock().unwrap_or_else(|p| p.into_inner());
                                rep.steps += 1;
                                rep.rows += r.rows;
                                let loss = r.loss / r.rows.max(1) as f64;
                                rep.losses.push(loss);
                                if config.log_every > 0 && rep.steps % config.log_every == 1 {
                                    let waited: f64 = loaders
                                        .iter()
                                        .map(|l| l.stall().as_secs_f64())
                                        .sum::<f64>()
                                        / ranks as f64;
                                    let wall = started.elapsed().as_secs_f64();
                                    hydrant_operators::log_line!(
                                        "hydrant: step {:>4}  logloss {loss:.4}  {:>7.0} rows/s  \
                                         waiting for data {:>4.1}%",
                                        rep.steps,
                                        rep.rows as f64 / wall,
                                        100.0 * waited / wall,
                                    );
                                }
                            }
                            r.clear_step();
                        }
                        barrier.wait();
                        let stop = reduced
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .decided
                            .clone();
                        if let Some(why) = stop {
                            return why;
                        }
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| "a trainer panicked".into()))
            .collect()
    });
    if let Some(e) = failures.into_iter().find(|e| !e.is_empty()) {
        return Err(Error::Dataflow(format!("training stopped: {e}")));
    }
    Ok(report.into_inner().unwrap_or_else(|p| p.into_inner()))
}

impl Reduced {
    fn add(&mut self, local: &mut Reduced) {
        if self.dense.len() < local.dense.len() {
            self.dense.resize(local.dense.len(), 0.0);
        }
        for (a, b) in self.dense.iter_mut().zip(&local.dense) {
            *a += b;
        }
        self.ids.append(&mut local.ids);
        self.bias += local.bias;
        self.loss += local.loss;
        self.rows += local.rows;
        if let Some(why) = local.stop.take() {
            // An error outranks a plain end of data.
            if self.stop.as_ref().is_none_or(|s| s.is_empty()) {
                self.stop = Some(why);
            }
        }
        local.dense.iter_mut().for_each(|g| *g = 0.0);
        local.bias = 0.0;
        local.loss = 0.0;
        local.rows = 0;
    }

    fn clear_step(&mut self) {
        self.dense.iter_mut().for_each(|g| *g = 0.0);
        self.ids.clear();
        self.bias = 0.0;
        self.loss = 0.0;
        self.rows = 0;
        self.decided = self.stop.take();
    }
}

/// Sizes the model from the first batch any rank sees.
fn init(model: &RwLock<Option<Model>>, batch: &TrainingBatch, config: &TrainConfig) {
    if model.read().unwrap_or_else(|p| p.into_inner()).is_some() {
        return;
    }
    let mut m = model.write().unwrap_or_else(|p| p.into_inner());
    if m.is_none() {
        let d = batch.dense.shape[1];
        *m = Some(Model {
            dense: vec![0.0; d],
            ids: vec![0.0; config.id_buckets],
            bias: 0.0,
            g_dense: vec![1e-6; d],
            g_ids: vec![1e-6; config.id_buckets],
            g_bias: 1e-6,
        });
    }
}

fn bucket(column: usize, id: i64, buckets: usize) -> usize {
    let h = (id as u64 ^ ((column as u64) << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 20) as usize % buckets
}

/// Adds the gradients of `batch`'s real rows to `out`.
fn gradients(m: &Model, batch: &TrainingBatch, config: &TrainConfig, out: &mut Reduced) {
    let (Some(dense), Some(ids)) = (batch.dense.host(), batch.ids.host()) else {
        out.stop = Some("logreg trains on host batches only".into());
        return;
    };
    let Some(labels) = batch.labels.as_ref().and_then(|l| l.host()) else {
        out.stop = Some("logreg needs a label".into());
        return;
    };
    let (d, k) = (batch.dense.shape[1], batch.ids.shape[1]);
    if out.dense.len() < d {
        out.dense.resize(d, 0.0);
    }
    for r in 0..batch.rows() {
        if batch.is_padding.value(r) {
            continue;
        }
        let x = &dense[r * d..(r + 1) * d];
        let row_ids = &ids[r * k..(r + 1) * k];
        let mut z = m.bias;
        z += x.iter().zip(&m.dense).map(|(a, b)| a * b).sum::<f32>();
        for (c, &id) in row_ids.iter().enumerate() {
            z += m.ids[bucket(c, id, config.id_buckets)];
        }
        let p = 1.0 / (1.0 + (-z).exp());
        let y = labels[r];
        let eps = 1e-7;
        out.loss -= (y * (p + eps).ln() + (1.0 - y) * (1.0 - p + eps).ln()) as f64;
        let g = p - y;
        for (acc, &xi) in out.dense.iter_mut().zip(x) {
            *acc += g * xi;
        }
        for (c, &id) in row_ids.iter().enumerate() {
            out.ids.push((bucket(c, id, config.id_buckets), g));
        }
        out.bias += g;
        out.rows += 1;
    }
}

/// One AdaGrad update with the gradients averaged over the step's real rows.
fn apply(m: &mut Model, r: &Reduced, lr: f32) {
    let scale = 1.0 / r.rows.max(1) as f32;
    let step = |w: &mut f32, acc: &mut f32, g: f32| {
        let g = g * scale;
        *acc += g * g;
        *w -= lr * g / acc.sqrt();
    };
    for i in 0..m.dense.len().min(r.dense.len()) {
        step(&mut m.dense[i], &mut m.g_dense[i], r.dense[i]);
    }
    // Sparse: sum each bucket's gradient first, so AdaGrad sees one update per bucket.
    let mut ids = r.ids.clone();
    ids.sort_unstable_by_key(|e| e.0);
    let mut i = 0;
    while i < ids.len() {
        let b = ids[i].0;
        let mut g = 0.0;
        while i < ids.len() && ids[i].0 == b {
            g += ids[i].1;
            i += 1;
        }
        step(&mut m.ids[b], &mut m.g_ids[b], g);
    }
    step(&mut m.bias, &mut m.g_bias, r.bias);
}
