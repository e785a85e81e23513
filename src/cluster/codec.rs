//! How the cluster's processes send batchinfer's own plan nodes to each other: Ballista's codecs,
//! with `read_blob`'s table (client to scheduler) and exec (scheduler to executors) added. Every
//! process uses these: the client's session, the scheduler and the executors.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{Result, TableReference};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

/// What starts the bytes of a node batchinfer encodes: no protobuf message of Ballista's does.
const BLOB_TABLE: &[u8] = b"\0batchinfer:read_blob-table\0";
const BLOB_EXEC: &[u8] = b"\0batchinfer:read_blob-exec\0";

/// Ballista's logical codec, and `read_blob`'s table.
#[derive(Debug, Default)]
pub struct LogicalCodec {
    ballista: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        self.ballista.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        match buf.strip_prefix(BLOB_TABLE) {
            Some(table) => crate::blob::wire::decode_table(table),
            None => self
                .ballista
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        match crate::blob::wire::encode_table(node.as_ref()) {
            Some(table) => {
                buf.extend_from_slice(BLOB_TABLE);
                buf.extend_from_slice(&table);
                Ok(())
            }
            None => self
                .ballista
                .try_encode_table_provider(table_ref, node, buf),
        }
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.ballista.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.ballista.try_encode_file_format(buf, node)
    }
}

/// Ballista's physical codec, and `read_blob`'s exec.
#[derive(Debug, Default)]
pub struct PhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match buf.strip_prefix(BLOB_EXEC) {
            Some(exec) => crate::blob::wire::decode_exec(exec, ctx),
            None => self.ballista.try_decode(buf, inputs, ctx, proto_converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match crate::blob::wire::encode_exec(node.as_ref()) {
            Some(exec) => {
                buf.extend_from_slice(BLOB_EXEC);
                buf.extend_from_slice(&exec);
                Ok(())
            }
            None => self.ballista.try_encode(node, buf, proto_converter),
        }
    }
}

/// The codecs, as every process of a cluster is given them.
pub fn logical() -> Arc<dyn LogicalExtensionCodec> {
    Arc::new(LogicalCodec::default())
}

pub fn physical() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(PhysicalCodec::default())
}
