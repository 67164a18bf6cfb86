//! The XDP object loaded for `BPF_PROG_RUN`: an unattached copy with its
//! own maps (`DEVICES` filled with the two interfaces), shared by the
//! packet-level tests (`nat_prog_run`, `malformed_corpus`). Create it inside
//! the router namespace (`Topology::in_ns`) so `bpf_fib_lookup` sees that
//! namespace's routes and neighbours.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, DevMapHash, HashMap, Map, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use router_common::maps::{
    CONFIG_MAP, CONNTRACK_MAP, COUNTERS_MAP, Config, Counter, CounterValue, DEVICES_MAP, FlowEntry,
    FlowKey, PORT_FORWARDS_MAP, PROGRAM_NAME, PortForwardKey, PortForwardTarget,
};

/// The loaded program and its maps, taken out of the object (owned).
pub struct LoadedRouter {
    pub ebpf: Ebpf,
    pub counters: PerCpuArray<MapData, CounterValue>,
    pub conntrack: HashMap<MapData, FlowKey, FlowEntry>,
    pub forwards: HashMap<MapData, PortForwardKey, PortForwardTarget>,
    pub config: Array<MapData, Config>,
    pub devices: DevMapHash<MapData>,
    pub lan: u32,
    pub wan: u32,
}

/// One `BPF_PROG_RUN`: verdict, output frame, and every counter that moved.
pub struct ProgRun {
    pub verdict: u32,
    pub out: Vec<u8>,
    pub delta: Vec<(Counter, CounterValue)>,
}

impl LoadedRouter {
    /// Loads the object with a conntrack table of `ct_entries` entries,
    /// checks that it is an LRU hash, and fills `DEVICES` with `lan`, `wan`.
    ///
    /// # Panics
    /// If loading or verification fails.
    #[must_use]
    pub fn load(lan: u32, wan: u32, ct_entries: u32) -> Self {
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(CONNTRACK_MAP, ct_entries)
            .load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
            .expect("load the XDP object");
        let mut take = |name: &str| -> Map {
            ebpf.take_map(name)
                .unwrap_or_else(|| panic!("the object has no map {name}"))
        };
        let ct = take(CONNTRACK_MAP);
        assert!(
            matches!(ct, Map::LruHashMap(_)),
            "CONNTRACK is not an LRU hash: {ct:?}"
        );
        let conntrack = HashMap::try_from(ct).unwrap();
        let counters = PerCpuArray::try_from(take(COUNTERS_MAP)).unwrap();
        let forwards = HashMap::try_from(take(PORT_FORWARDS_MAP)).unwrap();
        let config = Array::try_from(take(CONFIG_MAP)).unwrap();
        let mut devices = DevMapHash::try_from(take(DEVICES_MAP)).unwrap();
        devices.insert(lan, lan, None, 0).unwrap();
        devices.insert(wan, wan, None, 0).unwrap();
        let prog: &mut Xdp = ebpf.program_mut(PROGRAM_NAME).unwrap().try_into().unwrap();
        prog.load().expect("the verifier accepts the program");
        Self {
            ebpf,
            counters,
            conntrack,
            forwards,
            config,
            devices,
            lan,
            wan,
        }
    }

    /// Adds a port-forward rule.
    ///
    /// # Panics
    /// If the map update fails.
    pub fn forward(&mut self, proto: u8, port: u16, addr: [u8; 4], to: u16) {
        let k = PortForwardKey {
            proto,
            pad: 0,
            port,
        };
        let v = PortForwardTarget {
            addr,
            port: to,
            pad: 0,
        };
        self.forwards.insert(k, v, 0).unwrap();
    }

    /// Every counter summed over the CPUs, in `Counter::ALL` order.
    ///
    /// # Panics
    /// If the map cannot be read.
    #[must_use]
    pub fn counter_values(&self) -> Vec<CounterValue> {
        Counter::ALL
            .iter()
            .map(|&c| {
                let per_cpu = self.counters.get(&(c as u32), 0).unwrap();
                per_cpu
                    .iter()
                    .fold(CounterValue::default(), |a, v| CounterValue {
                        packets: a.packets + v.packets,
                        bytes: a.bytes + v.bytes,
                    })
            })
            .collect()
    }

    /// Runs the program once on `frame` as if it arrived on `ifindex`.
    ///
    /// # Panics
    /// If `BPF_PROG_RUN` fails.
    #[must_use]
    pub fn test_run(&self, frame: &[u8], ifindex: u32) -> ProgRun {
        let prog: &Xdp = self.ebpf.program(PROGRAM_NAME).unwrap().try_into().unwrap();
        let before = self.counter_values();
        let mut out = vec![0u8; frame.len() + 256];
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
        // rx_queue_index, egress_ifindex.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&u32::try_from(frame.len()).unwrap().to_ne_bytes());
        ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let r = prog.test_run(opts).expect("BPF_PROG_RUN");
        out.truncate(r.data_size_out as usize);
        let after = self.counter_values();
        let delta = Counter::ALL
            .iter()
            .zip(before.iter().zip(&after))
            .filter_map(|(&c, (b, a))| {
                let d = CounterValue {
                    packets: a.packets - b.packets,
                    bytes: a.bytes - b.bytes,
                };
                (d != CounterValue::default()).then_some((c, d))
            })
            .collect();
        ProgRun {
            verdict: r.return_value,
            out,
            delta,
        }
    }
}

/// splitmix64: a small deterministic PRNG for generated test input.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
