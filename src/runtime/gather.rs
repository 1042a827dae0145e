//! Small exchanges of values between workers, outside any job's dataflow: every process of
//! a cluster tells the others one value ([`gather`]; a serving cluster's processes learn
//! each other's Flight locations this way, so they may bind port 0), and every worker
//! sends one value to each worker ([`all_to_all`]; fitting merges statistics this way).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::ExchangeData;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Input};
use timely::dataflow::operators::{Exchange, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::worker::Worker;

use super::cluster::Cluster;
use crate::error::{Error, Result};

/// Longest a waiting worker sleeps between looks.
const PARK: Duration = Duration::from_millis(1);

/// Every process's `value`, by process: this process's is `value`, the others' are what
/// they passed. One process returns `[value]` without starting anything.
pub fn gather(cluster: &Cluster, value: String) -> Result<Vec<String>> {
    if cluster.processes == 1 {
        return Ok(vec![value]);
    }
    // One worker per process is enough to say one value.
    let one = Cluster {
        workers: 1,
        ..cluster.clone()
    };
    // The worker leaves its values here: joining the cluster's threads may fail after it
    // is done (a peer that finished first closed its connections).
    let slot = Arc::new(Mutex::new(None));
    let put = slot.clone();
    let guards = one.execute(None, move |worker| {
        let heard = Rc::new(RefCell::new(Vec::<(usize, String)>::new()));
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        let h = heard.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            scope
                .input_from(&mut input)
                .broadcast()
                .probe_with(&probe)
                .sink(Pipeline, "Gather", move |(input, _)| {
                    input.for_each(|_, data| h.borrow_mut().extend(data.drain(..)))
                });
        });
        input.send((worker.index(), value.clone()));
        input.advance_to(1);
        drop(input);
        while !probe.done() {
            worker.step_or_park(Some(PARK));
        }
        let mut heard = heard.take();
        heard.sort();
        let values = heard.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        if let Ok(mut slot) = put.lock() {
            *slot = Some(values);
        }
    })?;
    if let Some(Some(Err(panic))) = guards.join().map(|r| r.into_iter().next()) {
        return Err(Error::Dataflow(panic));
    }
    let values = slot.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| {
        // A peer that left before it said what it runs has said why itself; most often
        // the processes were started with other cluster sizes, so each waits for a peer
        // the others do not count.
        Error::Dataflow(
            "the cluster's processes did not all say what they run: one left first (its \
                 own error says why; do every process's --processes and hostfile agree?)"
                .into(),
        )
    })?;
    if values.len() != cluster.processes {
        return Err(Error::Dataflow(format!(
            "heard {} of the cluster's {} processes",
            values.len(),
            cluster.processes
        )));
    }
    Ok(values)
}

/// Sends `sends[w]` to worker `w` and returns what every worker sent this one, by sender.
///
/// Every worker must call it, with one value per worker, at the same point of its
/// program: it builds a dataflow, and waits until every worker's value has arrived.
pub fn all_to_all<D: ExchangeData + Clone>(worker: &mut Worker, sends: Vec<D>) -> Vec<D> {
    let (index, peers) = (worker.index(), worker.peers());
    assert_eq!(sends.len(), peers, "one value per worker");
    let heard = Rc::new(RefCell::new(Vec::<(usize, usize, D)>::new()));
    let mut input = InputHandle::new();
    let probe = ProbeHandle::new();
    let h = heard.clone();
    worker.dataflow::<u64, _, _>(|scope| {
        // Taken by value: a value may be large (a vocabulary's counts), and copying each
        // out of the stream (as `inspect` would) was a fifth of a fit's time.
        scope
            .input_from(&mut input)
            .exchange(|(to, _, _): &(usize, usize, D)| *to as u64)
            .probe_with(&probe)
            .sink(Pipeline, "AllToAll", move |(input, _)| {
                input.for_each(|_, data| h.borrow_mut().extend(data.drain(..)))
            });
    });
    for (to, value) in sends.into_iter().enumerate() {
        input.send((to, index, value));
    }
    input.advance_to(1);
    drop(input);
    while heard.borrow().len() < peers || !probe.done() {
        worker.step_or_park(Some(PARK));
        super::fate::abandon_if_failed();
    }
    let mut heard = heard.take();
    heard.sort_by_key(|(_, from, _)| *from);
    heard.into_iter().map(|(_, _, value)| value).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_hears_every_value_in_process_order() {
        let ports: Vec<String> = (0..3)
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().to_string()
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, ports.join("\n")).unwrap();
        let threads: Vec<_> = (0..3)
            .map(|p| {
                let cluster = Cluster {
                    workers: 2,
                    processes: 3,
                    process: p,
                    hostfile: Some(hosts.clone()),
                    secret: None,
                };
                std::thread::spawn(move || gather(&cluster, format!("process {p}")))
            })
            .collect();
        for t in threads {
            let heard = t.join().unwrap().unwrap();
            assert_eq!(heard, ["process 0", "process 1", "process 2"]);
        }
        let alone = gather(&Cluster::local(2), "me".into()).unwrap();
        assert_eq!(alone, ["me"]);
    }
}
