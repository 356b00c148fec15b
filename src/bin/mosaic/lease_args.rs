//! `mosaic lane lease|renew|unlease|leases`: elastic lanes (spec §13), leased for a while
//! and destroyed by the coordinator when the lease ends; and what `mosaic assign` without
//! `--lane` asks of the lane it is placed on (`PlaceArgs`, `--elastic`).

use std::process::ExitCode;

use clap::Subcommand;
use mosaic::coordinator::leases::LeaseAsk;
use mosaic::coordinator::placement::{ElasticAsk, PlacementAsk};
use mosaic::coordinator::service::OperatorRequest;

use crate::at::CoordinatorAt;

#[derive(Subcommand)]
pub(crate) enum ElasticOp {
    /// Lease a new lane on a host (within the capacity the roster declares for it): the
    /// host makes it under a fresh incarnation, and the coordinator destroys it once the
    /// lease is past its deadline with nothing on it. Answers once the lane is made.
    Lease {
        /// The host that makes the lane.
        #[arg(long = "host")]
        host_id: String,
        /// The exact runtime (family@version) the lane is for; the host must advertise it.
        #[arg(long)]
        runtime: String,
        /// How long the lease lives without a renewal (8s, 30m, 2h).
        #[arg(long, default_value = "30m")]
        ttl: String,
        /// How long it may live at most, renewals included.
        #[arg(long, default_value = "8h")]
        max_lifetime: String,
        /// A label KEY=VALUE of the lane (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        /// A role the lane is for.
        #[arg(long)]
        role: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Renew a lease: its deadline moves to now plus its TTL (database time), never past its
    /// maximum lifetime. An expired lease is not brought back.
    Renew {
        #[arg(long = "lease")]
        lease_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// End a lease now: its lane (if its host made it) is destroyed once it holds no work.
    /// The way out of a quarantined lease.
    Unlease {
        #[arg(long = "lease")]
        lease_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Every lease: state, epoch, deadlines (and those destroyed in the last hour).
    Leases {
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

/// What a placed lane must offer (`mosaic assign` without --lane).
#[derive(clap::Args)]
pub(crate) struct PlaceArgs {
    /// Without --lane: a label KEY=VALUE the placed lane must declare (repeatable).
    #[arg(long = "label", conflicts_with = "lane_id")]
    pub labels: Vec<String>,
    /// Without --lane: a role the placed lane must be eligible for.
    #[arg(long, conflicts_with = "lane_id")]
    pub role: Option<String>,
    /// Without --lane: when no lane is eligible, lease an elastic lane (with these labels
    /// and role) on a host the roster declares, and place the assignment on it.
    #[arg(long, conflicts_with = "lane_id")]
    pub elastic: bool,
    /// With --elastic: the lease's TTL (8s, 30m, 2h).
    #[arg(long, default_value = "30m", requires = "elastic")]
    pub elastic_ttl: String,
    /// With --elastic: the lease's maximum lifetime.
    #[arg(long, default_value = "8h", requires = "elastic")]
    pub elastic_max_lifetime: String,
}

impl PlaceArgs {
    /// The placement asked for: none when a lane is named.
    pub fn ask(self, lane_named: bool) -> Result<Option<PlacementAsk>, String> {
        if lane_named {
            return Ok(None);
        }
        let mut ask = PlacementAsk {
            labels: Default::default(),
            role: self.role,
            elastic: None,
        };
        for l in self.labels {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| format!("--label takes KEY=VALUE, not {l:?}"))?;
            ask.labels.insert(k.to_string(), v.to_string());
        }
        if self.elastic {
            ask.elastic = Some(ElasticAsk {
                ttl_ms: millis("elastic-ttl", &self.elastic_ttl)?,
                max_lifetime_ms: millis("elastic-max-lifetime", &self.elastic_max_lifetime)?,
            });
        }
        Ok(Some(ask))
    }
}

/// A duration as `8s`, `30m`, `2h` (or `1h30m`), in milliseconds.
fn millis(flag: &str, d: &str) -> Result<u64, String> {
    let parsed = humantime::parse_duration(d)
        .map_err(|e| format!("--{flag} {d:?}: a duration like 8s, 30m or 2h ({e})"))?;
    u64::try_from(parsed.as_millis()).map_err(|_| format!("--{flag} {d:?} is too long"))
}

pub(crate) fn run(op: ElasticOp) -> anyhow::Result<ExitCode> {
    match op {
        ElasticOp::Lease {
            host_id,
            runtime,
            ttl,
            max_lifetime,
            labels,
            role,
            at,
        } => {
            let ask = (|| {
                let mut ask = LeaseAsk {
                    host_id,
                    runtime,
                    labels: Default::default(),
                    role,
                    ttl_ms: millis("ttl", &ttl)?,
                    max_lifetime_ms: millis("max-lifetime", &max_lifetime)?,
                };
                for l in labels {
                    let (k, v) = l
                        .split_once('=')
                        .ok_or_else(|| format!("--label takes KEY=VALUE, not {l:?}"))?;
                    ask.labels.insert(k.to_string(), v.to_string());
                }
                ask.validate()?;
                Ok::<_, String>(ask)
            })();
            match ask {
                Ok(ask) => at.call(OperatorRequest::LaneLease {
                    ask,
                    request_id: None,
                }),
                Err(e) => at.refuse(e),
            }
        }
        ElasticOp::Renew { lease_id, at } => at.call(OperatorRequest::LaneRenew {
            lease_id,
            request_id: None,
        }),
        ElasticOp::Unlease { lease_id, at } => at.call(OperatorRequest::LaneUnlease {
            lease_id,
            request_id: None,
        }),
        ElasticOp::Leases { at } => at.call(OperatorRequest::Leases),
    }
}

/// `mosaic retarget`: the operator-approved form of the retarget policy (spec §6.3).
#[derive(clap::Args)]
pub(crate) struct RetargetArgs {
    /// The work in recovery whose start failed before activation.
    #[arg(long = "assignment")]
    pub assignment_id: String,
    #[command(flatten)]
    pub at: CoordinatorAt,
}

pub(crate) fn retarget(r: RetargetArgs) -> anyhow::Result<ExitCode> {
    r.at.call(OperatorRequest::Retarget {
        assignment_id: r.assignment_id,
        request_id: None,
    })
}
