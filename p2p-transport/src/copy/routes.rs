//! The routes [`Transport::copy_peer`](super::Transport::copy_peer) takes: mode selection
//! ([`crate::mode::select`]) over the topology (discovered at first use) and the configuration
//! (the `P2P_*` environment, or one set by the program), chosen and logged once per pair of GPUs.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::config::Config;
use crate::context::lazy::Lazy;
use crate::error::{Error, Result};
use crate::mode::{select, Direction, Endpoint, Engine, Mode, Route};
use crate::topo::Topology;

/// The routes chosen so far, with what chooses them.
pub(crate) struct Routes {
    /// Set by the program; `None`: the `P2P_*` environment, read at each choice.
    config: Mutex<Option<Config>>,
    topology: Lazy<Topology>,
    chosen: Mutex<HashMap<(usize, usize), Route>>,
}

impl Routes {
    pub(crate) fn new() -> Routes {
        Routes {
            config: Mutex::new(None),
            topology: Lazy::new("topology discovery"),
            chosen: Mutex::new(HashMap::new()),
        }
    }

    /// Uses `config` from now on, and forgets the routes chosen under the previous one.
    pub(crate) fn set_config(&self, config: Config) {
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = Some(config);
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The route from GPU `a` to GPU `b`: chosen (and logged by mode selection) at its first
    /// use, then reused until [`set_config`](Self::set_config).
    pub(super) fn get(&self, a: usize, b: usize) -> Result<Route> {
        if let Some(r) = self
            .chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(a, b))
        {
            return Ok(r.clone());
        }
        let ends = [a, b].map(|gpu| Endpoint {
            rank: gpu,
            gpu,
            process: 0,
        });
        let route = if a == b {
            Route {
                from: ends[0],
                to: ends[0],
                mode: Mode::Local,
                direction: Direction::Write,
                engine: Engine::CopyEngine,
                link: "same GPU".into(),
                reason: "both buffers on one GPU".into(),
            }
        } else {
            let topology = self
                .topology
                .get(|| crate::topo::discover().map_err(Error::from))?;
            select(topology, &ends, &self.config()?)?
                .into_iter()
                .find(|r| r.from.gpu == a && r.to.gpu == b)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("no route from GPU {a} to GPU {b}"))
                })?
        };
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((a, b), route.clone());
        Ok(route)
    }

    fn config(&self) -> Result<Config> {
        if let Some(c) = self
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(c);
        }
        Ok(Config::from_env_lenient()?)
    }
}
