// Package controller is LuffyMQ's control plane (luffy-controller): every
// period it measures each site, places every global pub/sub exchange's
// synchronisation instance (bridge/placement) and sends each site the
// federation links it must have (algorithms.md §2.4–2.6).
//
// # A round
//
//  1. Read every site in parallel. From the RabbitMQ management API
//     (rabbit-hole), in the site's virtual host (the path of its
//     amqp_url): the pubsub* exchanges with their publish_in and
//     publish_out counters; the federation queues RabbitMQ declares for
//     them ("federation: <exchange> -> <downstream>", marked
//     x-internal-purpose=federation) with their deliveries, enqueues and
//     backlog; the federation links with the publishes of their local
//     channels; the federation upstreams; the wq.<g> work queues; the
//     vhost's network connections and channels for the mean message size
//     (bytes received over messages published, as the thesis measures
//     it). From the luffymq status API (optional): each work-queue
//     group's capacity (online members, max length, weight, depth) and
//     how many messages of each other site's overflow its members took.
//  2. Turn counters into rates over the period (the difference from the
//     site's previous read; on a site's first read, from a read taken
//     --first-window earlier, so that every rate of a site covers the same
//     interval), per site and exchange: P^in = publishes minus those of federation
//     links, P^out = routed minus routed into federation queues, T^in =
//     federation links' publishes, T^out = federation queue deliveries.
//     With --rate-half-life, placement sees these rates' moving average
//     over rounds (damping.go). The overflow counters give each site's
//     work-queue overflow in and out over the overlay, in bytes per second
//     (messages times the receiver's mean message size).
//  3. Build placement.Input: the global exchanges are the pubsub*
//     exchanges present at two sites or more; sites, bandwidths and delays
//     come from the sites file; the previous plan is the controller's own
//     (after a restart, recovered from the links the sites run: the one
//     instance that federates an exchange from several upstreams is its
//     synchronisation site); λ from --lambda. Each site's bandwidth is
//     what its work-queue overflow leaves (placement.Site.WorkQueueInbound
//     and WorkQueueOutbound).
//  4. Place with placement.Improved (default) or placement.Heuristic
//     (--algorithm thesis), and describe what moved, why, and the cost
//     before and after (the exchange's term of eq. 2.1 at both sites and
//     the plan's total). With --move-margin, a move whose gain is within
//     the margin, and whose undoing adds no overload, is held: the
//     exchange keeps its synchronisation site (reason "held").
//  5. Translate the plan into each site's configuration (siteconfig.SiteConfig,
//     the §2.6 JSON the site agent reads): the synchronisation site
//     federates the exchange from every other instance and each other
//     instance from the synchronisation site (2·(N_i−1) links); every
//     wq.<g> queue present at two sites or more is federated between all
//     of them (each site's intake from the others' dead-letter exchange).
//     A configuration is published to the site's luffymq.config.<site>
//     queue (persistent, confirmed) only when it differs from what the
//     controller last published there or, on first contact, from the
//     federation the site already runs.
//
// A message from a non-synchronisation site crosses two federation links
// (origin -> sync -> destination): luffymq's site agent creates the links
// with --federation-max-hops, 2 by default.
//
// # Failures
//
// A site whose management API cannot be read keeps its last plan: its
// last measurements stand in for placement and nothing is sent to it until
// it answers again. Each API of each site (management, luffymq, amqp) logs
// one line when it becomes unreachable and one when it is back, not one
// per round, and counts in luffy_controller_site_unreachable_total. The
// controller only ever publishes configuration messages: if it stops,
// every site keeps forwarding over the links it has.
//
// # HTTP
//
// /metrics: luffy_controller_rounds_total, _last_round_duration_seconds,
// _plan_changes_total, _moves_total{exchange}, _sync_site{exchange,site},
// _site_reachable{site,api}, _site_unreachable_total{site,api},
// _configurations_published_total{site}, _plan_cost,
// _plan_overload_bytes_per_second, _global_exchanges, _moves_held_total{exchange},
// _moves_held. /api/v1/status: the damping settings and held moves, the
// plan with each exchange's inputs and reason, the last change, every
// site's reachability, rates, capacity and configuration (Status).
package controller
