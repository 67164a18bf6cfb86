//! The XDP object loaded for `BPF_PROG_RUN`: an unattached copy with its
//! own maps (`DEVICES` filled with the two interfaces), shared by the
//! packet-level tests (`prog_run`, `malformed_corpus`); the XDP action
//! values; and [`ResolvedTopology`], the topology those tests load it in.
//! Load it inside the router namespace ([`ResolvedTopology::in_router`]) so
//! `bpf_fib_lookup` sees that namespace's routes and neighbours.

use std::{collections::BTreeMap, os::fd::AsFd as _};

use aya::{
    Ebpf, EbpfLoader,
    maps::{DevMapHash, HashMap, Map, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use router_common::maps::{
    CONFIG_MAP, CONNTRACK_MAP, COUNTERS_MAP, Config, Counter, CounterValue, DEVICES_MAP, Endpoint,
    FRAGMENTS_MAP, FlowEntry, FlowKey, FragmentKey, FragmentXlat, ICMP_ANSWER_BUDGET_MAP,
    KERNEL_FLOWS_MAP, Mapping, MappingKey, NAT_ENDPOINTS_MAP, NAT_MAPPINGS_MAP, PORT_FORWARDS_MAP,
    PROGRAM_NAME, PortForwardKey, PortForwardTarget, Timeouts, VIRTUAL_MACS_MAP, VirtualMacKey,
};

use crate::addr::{HOST_IF, LAN_IF, WAN_IF, octets};
use crate::frames::{Frame, Ipv4};
use crate::rawbpf;
use crate::topology::{Ns, Topology};

// `enum xdp_action` of the kernel's UAPI: a program's return value.
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// The name of an XDP action value, for messages.
#[must_use]
pub fn action_name(verdict: u32) -> &'static str {
    match verdict {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "other",
    }
}

pub const NS_PER_SEC: u64 = 1_000_000_000;

/// `clock_gettime` or `clock_getres` (`call`, named `what`) of clock `id`,
/// in ns.
fn timespec_ns(
    call: unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int,
    what: &str,
    id: libc::clockid_t,
) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both calls write the timespec we pass.
    let rc = unsafe { call(id, &raw mut ts) };
    assert_eq!(rc, 0, "{what}");
    u64::try_from(ts.tv_sec).unwrap() * NS_PER_SEC + u64::try_from(ts.tv_nsec).unwrap()
}

fn clock_ns(id: libc::clockid_t) -> u64 {
    timespec_ns(libc::clock_gettime, "clock_gettime", id)
}

/// The coarse clock's resolution: one timer tick (`clock_getres`).
fn coarse_tick_ns() -> u64 {
    timespec_ns(
        libc::clock_getres,
        "clock_getres",
        libc::CLOCK_MONOTONIC_COARSE,
    )
}

/// `CLOCK_MONOTONIC` now: the clock of a flow entry's `last_seen_ns`.
#[must_use]
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` now: the data path's clock
/// (`bpf_ktime_get_coarse_ns`), up to a timer tick behind [`now_ns`].
#[must_use]
pub fn coarse_now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// The loaded program and its maps, taken out of the object (owned).
pub struct LoadedRouter {
    pub ebpf: Ebpf,
    pub counters: PerCpuArray<MapData, CounterValue>,
    pub conntrack: HashMap<MapData, FlowKey, FlowEntry>,
    pub forwards: HashMap<MapData, PortForwardKey, PortForwardTarget>,
    /// Standalone mode's NAT mappings (external port -> internal endpoint).
    pub mappings: HashMap<MapData, MappingKey, Mapping>,
    /// Their index by internal endpoint (`NAT_ENDPOINTS`).
    pub endpoints: HashMap<MapData, Endpoint, MappingKey>,
    pub config: ConfigMap,
    pub devices: DevMapHash<MapData>,
    /// The accepted VRRP virtual MACs; `None` in an object older than them
    /// (the benchmark's `--micro-compare`).
    pub virtual_macs: Option<HashMap<MapData, VirtualMacKey, u8>>,
    pub lan: u32,
    pub wan: u32,
}

/// A loaded object's `CONFIG` map. An object built before the last fields
/// of [`Config`] were added (the benchmark's `--micro-compare` of an older
/// build) has a shorter value: it gets the prefix of the value that its
/// layout knows (fields are only ever appended).
pub struct ConfigMap {
    map: MapData,
    value_size: usize,
}

impl ConfigMap {
    /// # Panics
    /// If `map` is not an array, or its value is longer than [`Config`].
    #[must_use]
    pub fn new(map: Map) -> Self {
        let Map::Array(map) = map else {
            panic!("CONFIG is not an array: {map:?}");
        };
        let value_size = map.info().expect("CONFIG's map info").value_size() as usize;
        assert!(
            value_size <= size_of::<Config>(),
            "CONFIG's value ({value_size} B) is longer than this build's Config ({} B): \
             the object is newer than this test kit",
            size_of::<Config>()
        );
        Self { map, value_size }
    }

    /// Writes the single entry.
    ///
    /// # Errors
    /// If the map update fails.
    pub fn set(&mut self, cfg: &Config) -> Result<(), String> {
        let value = rawbpf::pod_bytes(cfg);
        // Through the fd: aya's typed array needs the value sizes to match.
        router_common::bpf_insn::map_update(
            self.map.fd().as_fd(),
            &0u32.to_ne_bytes(),
            &value[..self.value_size],
        )
        .map_err(|e| format!("writing CONFIG: {e}"))
    }
}

/// One `BPF_PROG_RUN`: verdict, output frame, every counter that moved,
/// and a window of `CLOCK_MONOTONIC` that contains the program's clock
/// reading.
pub struct ProgRun {
    pub verdict: u32,
    pub out: Vec<u8>,
    pub delta: Vec<(Counter, CounterValue)>,
    pub t0: u64,
    pub t1: u64,
}

impl LoadedRouter {
    /// Loads the object with a conntrack table of `ct_entries` entries,
    /// checks that it is an LRU hash, and fills `DEVICES` with `lan`, `wan`.
    ///
    /// # Panics
    /// If loading or verification fails.
    #[must_use]
    pub fn load(lan: u32, wan: u32, ct_entries: u32) -> Self {
        Self::load_object(
            aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")),
            lan,
            wan,
            ct_entries,
        )
    }

    /// [`LoadedRouter::load`] of the object `object` (ELF bytes) instead of
    /// the embedded one: the micro-benchmark's side-by-side comparison of
    /// two builds.
    ///
    /// # Panics
    /// If loading or verification fails.
    #[must_use]
    pub fn load_object(object: &[u8], lan: u32, wan: u32, ct_entries: u32) -> Self {
        crate::host::record_failures();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(CONNTRACK_MAP, ct_entries)
            .load(object)
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
        let config = ConfigMap::new(take(CONFIG_MAP));
        let mappings = HashMap::try_from(take(NAT_MAPPINGS_MAP)).unwrap();
        let endpoints = HashMap::try_from(take(NAT_ENDPOINTS_MAP)).unwrap();
        let mut devices = DevMapHash::try_from(take(DEVICES_MAP)).unwrap();
        devices.insert(lan, lan, None, 0).unwrap();
        devices.insert(wan, wan, None, 0).unwrap();
        let virtual_macs = ebpf
            .take_map(VIRTUAL_MACS_MAP)
            .map(|m| HashMap::try_from(m).unwrap());
        let prog: &mut Xdp = ebpf.program_mut(PROGRAM_NAME).unwrap().try_into().unwrap();
        prog.load().expect("the verifier accepts the program");
        Self {
            ebpf,
            counters,
            conntrack,
            forwards,
            mappings,
            endpoints,
            config,
            devices,
            virtual_macs,
            lan,
            wan,
        }
    }

    /// Accepts frames to `mac` arriving on `ifindex` for `families`
    /// (`VMAC_IPV4` | `VMAC_IPV6`), as `router-ctl` does for a VRRP master's
    /// virtual MAC.
    ///
    /// # Panics
    /// If the object has no virtual MAC map or the update fails.
    pub fn accept_virtual_mac(&mut self, ifindex: u32, mac: [u8; 6], families: u8) {
        self.virtual_macs
            .as_mut()
            .expect("the object has no VIRTUAL_MACS map")
            .insert(VirtualMacKey::new(ifindex, mac), families, 0)
            .unwrap();
    }

    /// Writes `CONFIG` (which turns the data path on).
    ///
    /// # Panics
    /// If the map update fails.
    pub fn configure(&mut self, cfg: &Config) {
        self.config.set(cfg).unwrap();
    }

    /// Inserts or replaces a `CONNTRACK` entry.
    ///
    /// # Panics
    /// If the map update fails.
    pub fn put(&mut self, k: FlowKey, e: FlowEntry) {
        self.conntrack.insert(k, e, 0).unwrap();
    }

    /// Writes the `FRAGMENTS` record of a fragmented datagram, as its first
    /// fragment would have.
    ///
    /// # Panics
    /// If the object has no such map or the update fails.
    pub fn put_fragment(&mut self, k: FragmentKey, v: FragmentXlat) {
        let map = self
            .ebpf
            .map_mut(FRAGMENTS_MAP)
            .expect("the object has no FRAGMENTS map");
        HashMap::<_, FragmentKey, FragmentXlat>::try_from(map)
            .unwrap()
            .insert(k, v, 0)
            .unwrap();
    }

    /// Sets every CPU's ICMP answer budget of the data path (its
    /// `ICMP_ANSWER_BUDGET`: answers left, time of the last fill in
    /// `CLOCK_MONOTONIC` ns).
    ///
    /// # Panics
    /// If the object has no such map or the update fails.
    pub fn set_icmp_answer_budget(&mut self, tokens: u64, filled_ns: u64) {
        let map = self
            .ebpf
            .map_mut(ICMP_ANSWER_BUDGET_MAP)
            .expect("the object has no ICMP_ANSWER_BUDGET map");
        let mut budget = PerCpuArray::<_, [u64; 2]>::try_from(map).unwrap();
        let cpus = aya::util::nr_cpus().unwrap();
        let values = aya::maps::PerCpuValues::try_from(vec![[tokens, filled_ns]; cpus]).unwrap();
        budget.set(0, values, 0).unwrap();
    }

    /// CPU `cpu`'s ICMP answer budget: (answers left, time of the last
    /// fill).
    ///
    /// # Panics
    /// If the object has no such map or it cannot be read.
    #[must_use]
    pub fn icmp_answer_budget(&self, cpu: usize) -> (u64, u64) {
        let map = self
            .ebpf
            .map(ICMP_ANSWER_BUDGET_MAP)
            .expect("the object has no ICMP_ANSWER_BUDGET map");
        let budget = PerCpuArray::<_, [u64; 2]>::try_from(map).unwrap();
        let [tokens, filled] = budget.get(&0, 0).unwrap()[cpu];
        (tokens, filled)
    }

    /// The `FRAGMENTS` record of a fragmented datagram, if any.
    ///
    /// # Panics
    /// If the object has no such map.
    #[must_use]
    pub fn fragment(&self, k: &FragmentKey) -> Option<FragmentXlat> {
        let map = self
            .ebpf
            .map(FRAGMENTS_MAP)
            .expect("the object has no FRAGMENTS map");
        HashMap::<_, FragmentKey, FragmentXlat>::try_from(map)
            .unwrap()
            .get(k, 0)
            .ok()
    }

    /// The `KERNEL_FLOWS` marker of the LAN flow `k` (the time of its last
    /// LAN packet), if the data path left it to the kernel.
    ///
    /// # Panics
    /// If the object has no such map.
    #[must_use]
    pub fn kernel_flow(&self, k: &FlowKey) -> Option<u64> {
        let map = self
            .ebpf
            .map(KERNEL_FLOWS_MAP)
            .expect("the object has no KERNEL_FLOWS map");
        HashMap::<_, FlowKey, u64>::try_from(map)
            .unwrap()
            .get(k, 0)
            .ok()
    }

    /// Sets the `KERNEL_FLOWS` marker of the LAN flow `k` to `last_ns`.
    ///
    /// # Panics
    /// If the object has no such map or the update fails.
    pub fn put_kernel_flow(&mut self, k: FlowKey, last_ns: u64) {
        let map = self
            .ebpf
            .map_mut(KERNEL_FLOWS_MAP)
            .expect("the object has no KERNEL_FLOWS map");
        HashMap::<_, FlowKey, u64>::try_from(map)
            .unwrap()
            .insert(k, last_ns, 0)
            .unwrap();
    }

    /// Removes a `CONNTRACK` entry.
    ///
    /// # Panics
    /// If there is no such entry.
    pub fn remove(&mut self, k: &FlowKey) {
        self.conntrack.remove(k).unwrap();
    }

    /// The `CONNTRACK` entry of `k` as stored, if any.
    #[must_use]
    pub fn entry(&self, k: &FlowKey) -> Option<FlowEntry> {
        self.conntrack.get(k, 0).ok()
    }

    /// The whole `CONNTRACK` content as stored.
    ///
    /// # Panics
    /// If the map cannot be iterated.
    #[must_use]
    pub fn conntrack_entries(&self) -> BTreeMap<FlowKey, FlowEntry> {
        self.conntrack
            .iter()
            .map(|r| r.expect("iterate CONNTRACK"))
            .collect()
    }

    /// The port-forward rule for `proto`/`port`, if any.
    #[must_use]
    pub fn rule(&self, proto: u8, port: u16) -> Option<PortForwardTarget> {
        let k = PortForwardKey {
            proto,
            pad: 0,
            port,
        };
        self.forwards.get(&k, 0).ok()
    }

    /// The NAT mapping of external `port` of `proto`, if any.
    #[must_use]
    pub fn mapping(&self, proto: u8, port: u16) -> Option<Mapping> {
        let k = MappingKey {
            proto,
            pad: 0,
            port,
        };
        self.mappings.get(&k, 0).ok()
    }

    /// Writes the NAT mapping of external `port` of `proto`.
    ///
    /// # Panics
    /// If the map update fails.
    pub fn put_mapping(&mut self, proto: u8, port: u16, m: Mapping) {
        let k = MappingKey {
            proto,
            pad: 0,
            port,
        };
        self.mappings.insert(k, m, 0).unwrap();
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

    /// How many instructions the verifier processed to accept the program
    /// (`bpf_prog_info.verified_insns`): its complexity, against the
    /// kernel's limit of 1,000,000.
    ///
    /// # Panics
    /// If the kernel does not report it.
    #[must_use]
    pub fn verified_insns(&self) -> u32 {
        let prog: &Xdp = self.ebpf.program(PROGRAM_NAME).unwrap().try_into().unwrap();
        prog.info()
            .expect("the loaded program's info")
            .verified_instruction_count()
            .expect("verified_insns (kernel 5.16 and later)")
    }

    /// Runs the program once on `frame` as if it arrived on `ifindex`.
    ///
    /// # Panics
    /// If `BPF_PROG_RUN` fails.
    #[must_use]
    pub fn test_run(&self, frame: &[u8], ifindex: u32) -> ProgRun {
        let prog: &Xdp = self.ebpf.program(PROGRAM_NAME).unwrap().try_into().unwrap();
        let before = self.counter_values();
        // The program's clock is the coarse one as its CPU read it in the
        // current tick (router-ebpf's `clock`), which can be from just
        // before the tick's timekeeper update: a tick older than a coarse
        // reading taken before the run, a little more when NTP slews the
        // tick. Two ticks of margin; the coarse clock lags the fine one.
        let t0 = coarse_now_ns().saturating_sub(2 * coarse_tick_ns());
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
        let t1 = now_ns();
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
            t0,
            t1,
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

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn u16(&mut self) -> u16 {
        self.next_u64() as u16
    }

    /// A port in 1..=65535.
    pub fn port(&mut self) -> u16 {
        (self.next_u64() % 65535) as u16 + 1
    }

    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// A topology whose router has a neighbour entry (with the MAC) for every
/// host, and the MACs and ifindexes crafted frames need: what the
/// `BPF_PROG_RUN` tests run in.
pub struct ResolvedTopology {
    pub t: Topology,
    pub lan: u32,
    pub wan: u32,
    pub lan_mac: [u8; 6],
    pub wan_mac: [u8; 6],
    pub client_mac: [u8; 6],
    /// Zero without a second client.
    pub client2_mac: [u8; 6],
    pub server_mac: [u8; 6],
}

impl ResolvedTopology {
    /// [`Topology::new`] (or [`Topology::with_two_clients`]) with the
    /// neighbours resolved.
    ///
    /// # Panics
    /// If a host cannot reach the router or a neighbour entry is missing.
    #[must_use]
    #[expect(
        clippy::similar_names,
        reason = "client and client2 are the topology's own names"
    )]
    pub fn new(two_clients: bool) -> Self {
        let t = if two_clients {
            Topology::with_two_clients()
        } else {
            Topology::new()
        };
        // The server has no route back. The router learns the clients'
        // MACs from their ARP requests for the gateway and the server's from
        // its ARP request for the WAN address (the pings are answered by the
        // router itself), then resolves every host itself.
        let gw = crate::ROUTER_LAN_ADDR;
        assert!(t.ping(Ns::Client, gw, 1), "client cannot ping the router");
        if two_clients {
            assert!(t.ping(Ns::Client2, gw, 1), "client2 cannot ping the router");
        }
        assert!(
            t.ping(Ns::Server, crate::ROUTER_WAN_ADDR, 1),
            "server cannot ping the router"
        );
        t.warm_neighbours();
        let client_mac = t.mac(Ns::Client, HOST_IF);
        let client2_mac = if two_clients {
            t.mac(Ns::Client2, HOST_IF)
        } else {
            [0; 6]
        };
        let server_mac = t.mac(Ns::Server, HOST_IF);
        assert_neighbour(&t, octets::CLIENT, LAN_IF, client_mac);
        if two_clients {
            assert_neighbour(&t, octets::CLIENT2, LAN_IF, client2_mac);
        }
        assert_neighbour(&t, octets::SERVER, WAN_IF, server_mac);
        Self {
            lan: t.ifindex(Ns::Router, LAN_IF),
            wan: t.ifindex(Ns::Router, WAN_IF),
            lan_mac: t.mac(Ns::Router, LAN_IF),
            wan_mac: t.mac(Ns::Router, WAN_IF),
            client_mac,
            client2_mac,
            server_mac,
            t,
        }
    }

    /// `CONFIG` for this topology: the whole port range 1024-65535.
    #[must_use]
    pub fn config(&self, hash_seed: u32, timeouts: Timeouts) -> Config {
        Config {
            lan_ifindex: self.lan,
            wan_ifindex: self.wan,
            wan_addr: octets::WAN,
            port_min: 1024,
            port_max: 65535,
            hash_seed,
            admit: 0,
            filtering: 0,
            mss_clamp_mtu: router_common::mss::CLAMP_OFF,
            timeouts,
            lan_mac: self.lan_mac,
            wan_mac: self.wan_mac,
        }
    }

    /// As sent by the client to the router's `lan0`.
    #[must_use]
    pub fn client_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.lan_mac, self.client_mac, ip.clone()).bytes()
    }

    /// As sent by the second client to the router's `lan0`.
    #[must_use]
    pub fn client2_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.lan_mac, self.client2_mac, ip.clone()).bytes()
    }

    /// As sent by the server to the router's `wan0`.
    #[must_use]
    pub fn server_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.wan_mac, self.server_mac, ip.clone()).bytes()
    }

    /// As sent by the client (`from_lan`) or the server.
    #[must_use]
    pub fn sends(&self, from_lan: bool, ip: &Ipv4) -> Vec<u8> {
        if from_lan {
            self.client_sends(ip)
        } else {
            self.server_sends(ip)
        }
    }

    /// As redirected out of `wan0` to the server.
    #[must_use]
    pub fn to_server(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.server_mac, self.wan_mac, ip.clone()).bytes()
    }

    /// As redirected out of `lan0` to the client.
    #[must_use]
    pub fn to_client(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.client_mac, self.lan_mac, ip.clone()).bytes()
    }

    /// As redirected out of `lan0` to the second client.
    #[must_use]
    pub fn to_client2(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.client2_mac, self.lan_mac, ip.clone()).bytes()
    }

    /// Loads the object with `ct_entries` `CONNTRACK` entries in the router
    /// namespace (DEVICES filled) and runs `f` with it there.
    pub fn in_router<T: Send>(
        &self,
        ct_entries: u32,
        f: impl FnOnce(LoadedRouter) -> T + Send,
    ) -> T {
        let (lan, wan) = (self.lan, self.wan);
        self.t.in_ns(Ns::Router, move || {
            f(LoadedRouter::load(lan, wan, ct_entries))
        })
    }
}

/// `m` as `ip` writes a MAC address (`aa:bb:...`).
#[must_use]
pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn assert_neighbour(t: &Topology, addr: [u8; 4], dev: &str, mac: [u8; 6]) {
    let a = std::net::Ipv4Addr::from(addr).to_string();
    let out = t.exec_ok(Ns::Router, &["ip", "neigh", "show", &a, "dev", dev]);
    let want = format!("lladdr {}", mac_str(mac));
    assert!(
        out.contains(&want),
        "router has no neighbour {a} {want} on {dev}: {out:?}"
    );
}
