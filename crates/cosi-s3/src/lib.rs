//! cosi-s3, the sample COSI driver: buckets on any S3 endpoint, and per-access credentials the
//! endpoint enforces (an IAM user per BucketAccess, allowed on its bucket only, whose key is
//! deleted on revoke).

pub mod client;
pub mod driver;
pub mod serve;
pub mod sigv4;
