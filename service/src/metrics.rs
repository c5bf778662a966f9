//! Metrics every listener exports, labelled with the listener's name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::registry::Registry;

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

/// Declares a service's metrics in one place: each metric's field, its
/// type, how it is made (`Default` unless given) and its help text, which
/// is also the field's documentation and whose name is the field's. The
/// struct gets `new` (every metric registered under `prefix`, plus the
/// listeners' metrics and the token refusals), `render` (Prometheus text),
/// `listener_metrics`, `refusal_metrics` and `Default`.
///
/// ```ignore
/// strata_service::declare_metrics! {
///     /// Counters of the safekeeper.
///     pub struct Metrics in "strata_safekeeper" {
///         flushes: Counter => "WAL flushes",
///         flush_seconds: Histogram = Histogram::new(exponential_buckets(0.00005, 2.0, 16)) => "Time to flush",
///     }
/// }
/// ```
#[macro_export]
macro_rules! declare_metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident in $prefix:literal {
            $( $field:ident : $ty:ty $(= $init:expr)? => $help:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            registry: $crate::metrics::Registry,
            listeners: $crate::ListenerMetrics,
            refusals: $crate::auth::http::RefusalMetrics,
            $( #[doc = $help] pub $field: $ty, )*
        }

        impl $name {
            /// Every metric, registered.
            pub fn new() -> $name {
                let mut registry = $crate::metrics::Registry::with_prefix($prefix);
                $(
                    let $field: $ty = $crate::declare_metrics!(@init $ty $(, $init)?);
                    registry.register(stringify!($field), $help, $field.clone());
                )*
                let listeners = $crate::ListenerMetrics::register(&mut registry);
                let refusals = $crate::auth::http::RefusalMetrics::register(&mut registry);
                $name { registry, listeners, refusals, $( $field, )* }
            }

            /// The connection metrics of the listeners.
            pub fn listener_metrics(&self) -> $crate::ListenerMetrics {
                self.listeners.clone()
            }

            /// The counter of calls refused for their token.
            #[allow(dead_code)] // a service without token checks has no use for it
            pub fn refusal_metrics(&self) -> $crate::auth::http::RefusalMetrics {
                self.refusals.clone()
            }

            /// The metrics in Prometheus text format.
            pub fn render(&self) -> String {
                $crate::metrics::render(&self.registry)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
    (@init $ty:ty) => { <$ty>::default() };
    (@init $ty:ty, $init:expr) => { $init };
}

/// A registry's metrics in Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

    crate::declare_metrics! {
        /// Metrics of a made-up service.
        struct TestMetrics in "strata_test" {
            requests: Counter => "Requests served",
            open: Gauge => "Open things",
            latency_seconds: Histogram = Histogram::new(exponential_buckets(0.001, 2.0, 4)) => "Latency",
        }
    }

    #[test]
    fn declared_once_registered_and_rendered() {
        let m = TestMetrics::default();
        m.requests.inc_by(3);
        m.open.set(2);
        m.latency_seconds.observe(0.0015);
        m.listener_metrics().for_listener("pg").accepted.inc();
        let text = m.render();
        assert!(text.contains("# HELP strata_test_requests Requests served."), "{text}");
        assert!(text.contains("strata_test_requests_total 3"), "{text}");
        assert!(text.contains("strata_test_open 2"), "{text}");
        assert!(text.contains("strata_test_latency_seconds_bucket{le=\"0.002\"} 1"), "{text}");
        assert!(text.contains("strata_test_connections_accepted_total{listener=\"pg\"} 1"), "{text}");
    }
}
