//! A process the kit's signal guard is tested with
//! (`topology::an_interrupted_run_removes_its_namespaces`): it builds a
//! topology, starts a long process in one of its namespaces (in a process
//! group of its own, as the kit's children are), prints the namespaces'
//! names, and waits to be interrupted. Not a tool of its own.

use std::io::Write as _;

use tests::{Ns, Topology};

fn main() {
    let t = Topology::new();
    // Killed by the guard (or by the topology's drop, which also reaps it).
    #[expect(
        clippy::zombie_processes,
        reason = "the topology kills it; the process ends with it"
    )]
    let _sleeper = t.spawn(Ns::Server, &["sleep", "120"]);
    let names: Vec<&str> = [Ns::Client, Ns::Router, Ns::Server]
        .into_iter()
        .map(|ns| t.ns_name(ns))
        .collect();
    println!("namespaces {}", names.join(" "));
    let _ = std::io::stdout().flush();
    // Bounded: the test interrupts it long before.
    std::thread::sleep(std::time::Duration::from_mins(2));
}
