//! The program's verifier complexity: how many instructions the kernel's
//! verifier walks to accept it, against its limit of 1,000,000 per load.
//! Other kernels walk differently; a program near the limit here may be
//! refused there. Not a timing figure: a count this kernel reports.

use super::*;

/// What the verifier may spend on the program, here: 80 % of its limit.
const BUDGET: u32 = 800_000;

/// The program loads with the verifier walking at most [`BUDGET`]
/// instructions (`bpf_prog_info.verified_insns`): a subprogram called
/// where many distinct states reach it is walked again for each (MSS
/// clamping called from inside the cores took 740,000; from the entry
/// point 607,000; before it 531,000; 588,000 once subprograms returned
/// their verdicts packed in one register).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_verifier_accepts_the_program_within_its_budget() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let n = r.verified_insns();
        println!("verified instructions: {n} (budget {BUDGET}, limit 1000000)");
        assert!(
            n <= BUDGET,
            "the verifier walked {n} instructions, over {BUDGET}: close to its limit, the \
             program may be refused by another kernel"
        );
    });
}
