//! Metrics every listener exports, labelled with the listener's name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

/// Connection counters of every listener of a service.
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    open: Family<ListenerLabel, Gauge>,
    accepted: Family<ListenerLabel, Counter>,
    displaced: Family<ListenerLabel, Counter>,
    refused: Family<ListenerLabel, Counter>,
    accept_errors: Family<ListenerLabel, Counter>,
}

/// The counters of one listener.
pub(crate) struct OneListener {
    pub(crate) open: Gauge,
    pub(crate) accepted: Counter,
    pub(crate) displaced: Counter,
    pub(crate) refused: Counter,
    pub(crate) accept_errors: Counter,
}

impl ListenerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> ListenerMetrics {
        let m = ListenerMetrics::default();
        m.register_into(registry);
        m
    }

    /// Registers these metrics (their values are shared) in `registry`.
    pub fn register_into(&self, registry: &mut Registry) {
        let m = self;
        registry.register("connections_open", "Open connections per listener", m.open.clone());
        registry.register("connections_accepted", "Connections accepted per listener", m.accepted.clone());
        registry.register(
            "connections_displaced",
            "Connections that had not completed a greeting (or had no request in progress), closed to admit a newer one",
            m.displaced.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused because every place was taken by established or busy connections",
            m.refused.clone(),
        );
        registry.register("accept_errors", "Failed accepts (the listener keeps running)", m.accept_errors.clone());
    }

    pub(crate) fn for_listener(&self, name: &'static str) -> OneListener {
        let l = ListenerLabel { listener: name };
        OneListener {
            open: self.open.get_or_create(&l).clone(),
            accepted: self.accepted.get_or_create(&l).clone(),
            displaced: self.displaced.get_or_create(&l).clone(),
            refused: self.refused.get_or_create(&l).clone(),
            accept_errors: self.accept_errors.get_or_create(&l).clone(),
        }
    }
}
