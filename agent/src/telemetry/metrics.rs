//! The metrics registry: cumulative counters and last-value gauges, one series per metric name,
//! scope and set of dimension values. Exporters (Prometheus, OTLP, console) read snapshots of
//! it.
//!
//! A scope is whose a series is: the agent's own (capture, CUDA, Python) or one engine
//! instance's, whose identity attributes every one of its series carries, so that two engines
//! of one kind (two vLLM servers with the same model) never add up into one series.
use crate::FastMap;
use std::{
    collections::{BTreeMap, hash_map::Entry},
    sync::Arc,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    Counter,
    Gauge,
}

/// A metric as the spec defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: Kind,
    /// The spec's unit column (`Count`, `Times`, `Seconds`, `Ratio`).
    pub unit: &'static str,
    pub description: &'static str,
}

impl MetricDef {
    pub const fn counter(
        name: &'static str,
        unit: &'static str,
        description: &'static str,
    ) -> MetricDef {
        MetricDef {
            name,
            kind: Kind::Counter,
            unit,
            description,
        }
    }

    pub const fn gauge(
        name: &'static str,
        unit: &'static str,
        description: &'static str,
    ) -> MetricDef {
        MetricDef {
            name,
            kind: Kind::Gauge,
            unit,
            description,
        }
    }
}

/// Dimension name and value pairs, sorted by name.
pub type Dimensions = Vec<(&'static str, String)>;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sample {
    pub name: &'static str,
    pub kind: Kind,
    /// The identity of the engine instance the series belongs to (`service.instance.id`, ...);
    /// empty for the agent's own series.
    #[serde(skip_serializing_if = "resource_is_empty")]
    pub resource: Arc<Resource>,
    pub dimensions: BTreeMap<&'static str, String>,
    pub value: f64,
}

/// Upper bound on series (a hostile stream could invent model names); beyond it new series
/// are dropped and counted.
const MAX_SERIES: usize = 10_000;

/// The resource attribute that tells engine instances apart (OpenTelemetry's).
pub const SERVICE_INSTANCE_ID: &str = "service.instance.id";

/// An engine instance's identity: OpenTelemetry resource attributes (`service.instance.id`,
/// `container.id`, `k8s.pod.name`, ...), by key.
pub type Resource = BTreeMap<String, String>;

fn resource_is_empty(resource: &Arc<Resource>) -> bool {
    resource.is_empty()
}

/// Whose a series is: [`AGENT`], or an engine instance's scope from [`Registry::add_scope`].
pub type Scope = u32;
/// The agent's own series.
pub const AGENT: Scope = 0;

/// A set of dimensions as [`Registry::dims`] numbered it: a series is found by it without its
/// strings, and an engine that updates several metrics of one set (vLLM: up to nine a step)
/// sorts and hashes the set once instead of cloning it for each. Numbers change when a scope
/// is removed: a number is used within the update that asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DimsId(u32);

/// A series: metric name, scope, dimensions.
type SeriesKey = (&'static str, Scope, DimsId);

#[derive(Debug, Default)]
pub struct Registry {
    // The maps every update looks in are hashed: ordered maps compared the key's strings some
    // ten times a lookup (3.5 % of a vLLM replay). What reads them in order sorts what it reads.
    defs: FastMap<&'static str, MetricDef>,
    series: FastMap<SeriesKey, f64>,
    /// Every set of dimensions numbered since the last scope ended, and its number (at most
    /// [`MAX_SERIES`] of them, the bound on series).
    dims: Vec<Dimensions>,
    dims_ids: FastMap<Dimensions, DimsId>,
    /// Each engine instance's identity attributes, by scope.
    scopes: BTreeMap<Scope, Arc<Resource>>,
    /// The last scope handed out (never reused: an ended instance's number stays its own).
    last_scope: Scope,
    /// The scope that series written now belong to.
    scope: Scope,
    /// Updates lost to the series bound.
    pub dropped_updates: u64,
}

impl Registry {
    /// A new scope for an engine instance, whose series carry `attributes`.
    pub fn add_scope(&mut self, attributes: Resource) -> Scope {
        self.last_scope += 1;
        self.scopes.insert(self.last_scope, Arc::new(attributes));
        self.last_scope
    }

    /// What an engine instance is known as changed (node mode: its pod became known).
    pub fn set_resource(&mut self, scope: Scope, attributes: Resource) {
        if let Some(resource) = self.scopes.get_mut(&scope) {
            *resource = Arc::new(attributes);
        }
    }

    /// An engine instance ended: its scope and series go (a server that is gone has no
    /// current values).
    pub fn remove_scope(&mut self, scope: Scope) {
        self.scopes.remove(&scope);
        self.series.retain(|(_, s, _), _| *s != scope);
        self.forget_unused_dims();
    }

    /// Number again only the sets of dimensions that series still use, so that sets numbered
    /// for ended engine instances do not hold the bound for the ones that come after.
    fn forget_unused_dims(&mut self) {
        let mut renumbered: FastMap<DimsId, DimsId> = FastMap::default();
        let (mut dims, mut dims_ids) = (Vec::new(), FastMap::default());
        let series = std::mem::take(&mut self.series);
        for ((name, scope, old), value) in series {
            let new = *renumbered.entry(old).or_insert_with(|| {
                let set = self.dims[old.0 as usize].clone();
                let id = DimsId(dims.len() as u32);
                dims_ids.insert(set.clone(), id);
                dims.push(set);
                id
            });
            self.series.insert((name, scope, new), value);
        }
        (self.dims, self.dims_ids) = (dims, dims_ids);
    }

    /// Run `f` with every series it writes put in `scope`.
    pub fn in_scope<R>(&mut self, scope: Scope, f: impl FnOnce(&mut Registry) -> R) -> R {
        let previous = std::mem::replace(&mut self.scope, scope);
        let result = f(self);
        self.scope = previous;
        result
    }

    /// The number of a set of dimensions, for [`Registry::add_at`] and [`Registry::set_at`];
    /// None once [`MAX_SERIES`] sets are numbered (the updates that use it are counted as
    /// dropped).
    pub fn dims(&mut self, mut dims: Dimensions) -> Option<DimsId> {
        dims.sort();
        if let Some(&id) = self.dims_ids.get(&dims) {
            return Some(id);
        }
        if self.dims.len() >= MAX_SERIES {
            return None;
        }
        let id = DimsId(self.dims.len() as u32);
        self.dims.push(dims.clone());
        self.dims_ids.insert(dims, id);
        Some(id)
    }

    fn slot(&mut self, def: &MetricDef, dims: Option<DimsId>) -> Option<&mut f64> {
        if !self.defs.contains_key(def.name) {
            self.defs.insert(def.name, *def);
        }
        let Some(dims) = dims else {
            self.dropped_updates += 1;
            return None;
        };
        let full = self.series.len() >= MAX_SERIES;
        match self.series.entry((def.name, self.scope, dims)) {
            Entry::Occupied(slot) => Some(slot.into_mut()),
            Entry::Vacant(_) if full => {
                self.dropped_updates += 1;
                None
            }
            Entry::Vacant(slot) => Some(slot.insert(0.0)),
        }
    }

    /// Add to a counter (negative or non-finite amounts are ignored: counters only grow).
    pub fn add(&mut self, def: &MetricDef, dims: Dimensions, amount: f64) {
        let dims = self.dims(dims);
        self.add_at(def, dims, amount);
    }

    /// [`Registry::add`] to the series of numbered dimensions.
    pub fn add_at(&mut self, def: &MetricDef, dims: Option<DimsId>, amount: f64) {
        debug_assert_eq!(def.kind, Kind::Counter);
        if amount.is_finite()
            && amount >= 0.0
            && let Some(v) = self.slot(def, dims)
        {
            *v += amount;
        }
    }

    /// A counter whose running total is known (not its increments): it only ever grows.
    pub fn set_total(&mut self, def: &MetricDef, dims: Dimensions, total: f64) {
        debug_assert_eq!(def.kind, Kind::Counter);
        let dims = self.dims(dims);
        if let Some(v) = self.slot(def, dims)
            && total.is_finite()
            && total > *v
        {
            *v = total;
        }
    }

    pub fn set(&mut self, def: &MetricDef, dims: Dimensions, value: f64) {
        let dims = self.dims(dims);
        self.set_at(def, dims, value);
    }

    /// [`Registry::set`] of the series of numbered dimensions.
    pub fn set_at(&mut self, def: &MetricDef, dims: Option<DimsId>, value: f64) {
        debug_assert_eq!(def.kind, Kind::Gauge);
        if let Some(v) = self.slot(def, dims) {
            *v = value;
        }
    }

    pub fn def(&self, name: &str) -> Option<&MetricDef> {
        self.defs.get(name)
    }

    /// Every series, in key order (metric name, scope, then dimensions).
    fn sorted(&self) -> Vec<((&'static str, Scope, &Dimensions), f64)> {
        let mut series: Vec<_> = self
            .series
            .iter()
            .map(|(&(name, scope, dims), &value)| ((name, scope, self.dimensions(dims)), value))
            .collect();
        series.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        series
    }

    fn dimensions(&self, id: DimsId) -> &Dimensions {
        &self.dims[id.0 as usize]
    }

    /// Every series, by metric name, scope, then dimensions.
    pub fn snapshot(&self) -> Vec<Sample> {
        self.sorted()
            .into_iter()
            .map(|((name, scope, dims), value)| Sample {
                name,
                kind: self.defs[name].kind,
                resource: self.scopes.get(&scope).cloned().unwrap_or_default(),
                dimensions: dims.iter().cloned().collect(),
                value,
            })
            .collect()
    }

    /// How many series scope `scope` has.
    pub fn series_in(&self, scope: Scope) -> usize {
        self.series.keys().filter(|(_, s, _)| *s == scope).count()
    }

    /// The engine instances' scopes and their resources.
    pub fn scopes(&self) -> Vec<(Scope, Arc<Resource>)> {
        self.scopes.iter().map(|(s, r)| (*s, r.clone())).collect()
    }

    /// The series of one metric in one scope, by dimensions: dimensions and value.
    pub fn series(
        &self,
        name: &'static str,
        scope: Scope,
    ) -> impl Iterator<Item = (&Dimensions, f64)> {
        let mut series: Vec<_> = self
            .series
            .iter()
            .filter(|((n, s, _), _)| *n == name && *s == scope)
            .map(|(&(_, _, dims), value)| (self.dimensions(dims), *value))
            .collect();
        series.sort_unstable_by(|a, b| a.0.cmp(b.0));
        series.into_iter()
    }

    /// The value of one series (tests and the console): the first in key order that matches.
    pub fn value(&self, name: &str, dims: &[(&str, &str)]) -> Option<f64> {
        self.sorted()
            .into_iter()
            .find(|((n, _, d), _)| {
                *n == name
                    && d.len() == dims.len()
                    && dims
                        .iter()
                        .all(|(k, v)| d.iter().any(|(dk, dv)| dk == k && dv == v))
            })
            .map(|(_, v)| v)
    }

    /// Sum of a metric over all its series.
    pub fn total(&self, name: &str) -> f64 {
        self.series
            .iter()
            .filter(|((n, _, _), _)| *n == name)
            .map(|(_, v)| v)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: MetricDef = MetricDef {
        name: "c",
        kind: Kind::Counter,
        unit: "Count",
        description: "",
    };
    const G: MetricDef = MetricDef {
        name: "g",
        kind: Kind::Gauge,
        unit: "Ratio",
        description: "",
    };

    #[test]
    fn counters_add_gauges_replace() {
        let mut r = Registry::default();
        r.add(&C, vec![("b", "2".into()), ("a", "1".into())], 2.0);
        r.add(&C, vec![("a", "1".into()), ("b", "2".into())], 3.0);
        r.add(&C, vec![("a", "1".into()), ("b", "2".into())], -1.0);
        r.add(&C, vec![("a", "1".into()), ("b", "2".into())], f64::NAN);
        r.set(&G, vec![], 0.5);
        r.set(&G, vec![], 0.25);
        assert_eq!(r.value("c", &[("a", "1"), ("b", "2")]), Some(5.0));
        assert_eq!(r.value("g", &[]), Some(0.25));
        assert_eq!(r.snapshot().len(), 2);
    }

    #[test]
    fn totals_only_grow() {
        let mut r = Registry::default();
        r.set_total(&C, vec![], 5.0);
        r.set_total(&C, vec![], 3.0);
        r.set_total(&C, vec![], f64::NAN);
        assert_eq!(r.value("c", &[]), Some(5.0));
        r.set_total(&C, vec![], 7.0);
        assert_eq!(r.value("c", &[]), Some(7.0));
    }

    #[test]
    fn each_scope_keeps_its_own_series_and_carries_its_identity() {
        let mut r = Registry::default();
        let one = r.add_scope([("service.instance.id".into(), "host:1".into())].into());
        let two = r.add_scope([("service.instance.id".into(), "host:2".into())].into());
        r.in_scope(one, |r| r.add(&C, vec![("a", "1".into())], 2.0));
        r.in_scope(two, |r| r.add(&C, vec![("a", "1".into())], 3.0));
        r.set(&G, vec![], 1.0);
        let samples = r.snapshot();
        let c: Vec<_> = samples
            .iter()
            .filter(|s| s.name == "c")
            .map(|s| (s.resource["service.instance.id"].as_str(), s.value))
            .collect();
        assert_eq!(c, [("host:1", 2.0), ("host:2", 3.0)]);
        let g = samples.iter().find(|s| s.name == "g").expect("gauge");
        assert!(
            g.resource.is_empty(),
            "the agent's own series has no identity"
        );
        assert_eq!(r.total("c"), 5.0);
        assert_eq!(r.series("c", one).collect::<Vec<_>>().len(), 1);
        r.remove_scope(one);
        assert_eq!(r.series("c", one).count(), 0);
        assert_eq!(r.total("c"), 3.0);
        assert_eq!(r.scopes().len(), 1);
        // A later scope never takes an ended one's number.
        assert!(r.add_scope(Resource::new()) > two);
    }

    #[test]
    fn dimension_sets_are_numbered_once_and_forgotten_with_their_series() {
        let mut r = Registry::default();
        let one = r.add_scope(Resource::new());
        let id = r.dims(vec![("b", "2".into()), ("a", "1".into())]);
        assert_eq!(r.dims(vec![("a", "1".into()), ("b", "2".into())]), id);
        r.in_scope(one, |r| {
            r.add_at(&C, id, 2.0);
            r.add(&C, vec![("b", "2".into()), ("a", "1".into())], 3.0);
            r.set_at(&G, id, 0.5);
        });
        assert_eq!(r.value("c", &[("a", "1"), ("b", "2")]), Some(5.0));
        assert_eq!(r.value("g", &[("a", "1"), ("b", "2")]), Some(0.5));
        r.set(&G, vec![("kept", "1".into())], 7.0);
        // Every set the bound allows, numbered for one engine instance...
        r.in_scope(one, |r| {
            for i in 0..MAX_SERIES {
                let dims = r.dims(vec![("i", i.to_string())]);
                r.add_at(&C, dims, 1.0);
            }
        });
        assert_eq!(r.dims(vec![("new", "set".into())]), None);
        let dropped = r.dropped_updates;
        assert!(dropped > 0);
        // ... is forgotten with its series, and the set that stays keeps its series.
        r.remove_scope(one);
        assert_eq!(r.dims.len(), 1);
        assert_eq!(r.value("g", &[("kept", "1")]), Some(7.0));
        let two = r.add_scope(Resource::new());
        r.in_scope(two, |r| r.add(&C, vec![("i", "0".into())], 1.0));
        assert_eq!(r.value("c", &[("i", "0")]), Some(1.0));
        assert_eq!(r.dropped_updates, dropped);
    }

    #[test]
    fn series_are_bounded() {
        let mut r = Registry::default();
        for i in 0..MAX_SERIES + 5 {
            r.add(&C, vec![("i", i.to_string())], 1.0);
        }
        assert_eq!(r.snapshot().len(), MAX_SERIES);
        assert_eq!(r.dropped_updates, 5);
    }
}
