//! `csi-hostpath`: the suite's reference CSI driver. A complete CSI v1 plugin (Identity,
//! Controller, Node) on a state directory shared by every instance on a machine: ext4
//! volumes are images each node reaches through its own export, other filesystem volumes are
//! directories bind-mounted on nodes, block volumes are images on loop devices, snapshots are
//! archives or copies. State changes are crash-safe transactions; operations on one volume
//! never wait for another; a node ControllerUnpublished from a volume it still uses is fenced
//! (its export cut; its writers stopped). Controllers serve the CSI SnapshotMetadata service
//! (changed block tracking) for block and ext4 volumes. It also serves the podmon connectivity
//! extension.

pub mod beneath;
pub mod config;
pub mod controller;
pub mod data;
pub mod driver;
pub mod ephemeral;
pub mod error;
pub mod export;
pub mod group;
pub mod health;
pub mod identity;
pub mod journal;
pub mod legacy;
pub mod local;
pub mod metadata;
pub mod mounts;
pub mod node;
pub mod options;
pub mod recovery;
pub mod rules;
pub mod server;
pub mod sparse;
pub mod state;
pub mod table;
pub mod tree;
