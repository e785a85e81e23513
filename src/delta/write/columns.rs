//! The columns and protocol Delta keeps: a table's schema made Delta's and read back as it was
//! written (vectors, time without a time zone), and an INSERT's columns checked against it.

use super::*;

/// The protocol a commit sets, where it sets one: for a new table reader version 1 and writer
/// version 2 (what every reader reads), unless its columns hold a time without a time zone
/// (`timestamp_ntz`): then that table feature, on the table's protocol where it has one (versions
/// 3 and 7, its other features kept). None: the table's protocol as it is.
pub(super) fn protocol(
    table: Option<&deltalake_core::kernel::Protocol>,
    time_ntz: bool,
) -> Result<Option<deltalake_core::kernel::Protocol>> {
    const NTZ: &str = "timestampNtz";
    let invalid = |e: serde_json::Error| Error::Internal(format!("Delta protocol: {e}"));
    let mut protocol = match table {
        Some(table) => serde_json::to_value(table).map_err(invalid)?,
        None => serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2}),
    };
    let has_ntz = protocol["readerFeatures"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == NTZ));
    if !time_ntz || has_ntz {
        return match table {
            Some(_) => Ok(None),
            None => serde_json::from_value(protocol).map(Some).map_err(invalid),
        };
    }
    for (version, at_least) in [("minReaderVersion", 3), ("minWriterVersion", 7)] {
        let now = protocol[version].as_i64().unwrap_or(0);
        protocol[version] = now.max(at_least).into();
    }
    for features in ["readerFeatures", "writerFeatures"] {
        let mut list = protocol[features].as_array().cloned().unwrap_or_default();
        list.push(NTZ.into());
        protocol[features] = list.into();
    }
    serde_json::from_value(protocol).map(Some).map_err(invalid)
}

/// Whether `schema` holds a time without a time zone, anywhere.
pub(super) fn holds_time_ntz(schema: &Schema) -> bool {
    pub(super) fn holds(data_type: &DataType) -> bool {
        match data_type {
            DataType::Timestamp(_, None) => true,
            DataType::Struct(children) => children.iter().any(|c| holds(c.data_type())),
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::FixedSizeList(f, _)
            | DataType::Map(f, _) => holds(f.data_type()),
            _ => false,
        }
    }
    schema.fields().iter().any(|f| holds(f.data_type()))
}

/// The Delta schema of the Arrow `schema` a table's files are written with; a vector
/// (`FixedSizeList(n)`) keeps its length in its field's metadata ([`FIXED_SIZE_KEY`]). A
/// type Delta has no counterpart of is refused, naming the column.
pub fn delta_schema(name: &str, schema: &Schema) -> Result<StructType> {
    use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
    let fields = schema
        .fields()
        .iter()
        .map(|f| prepared(name, f.as_ref()))
        .collect::<Result<Vec<Field>>>()?;
    let prepared = Schema::new(fields);
    (&prepared).try_into_kernel().map_err(|e| {
        Error::table(
            name,
            format!(
                "table '{name}': its columns ({}) cannot be a Delta table's: {}",
                crate::delta::columns(&Arc::new(schema.clone())),
                crate::delta::readable(&e.to_string())
            ),
        )
    })
}

/// `field` as a Delta column: the length of each vector in it kept in its metadata, an unsigned
/// integer widened to the signed type that holds all its values (Delta has no unsigned types);
/// a column of no type (only NULLs, which other readers cannot read) and a vector of no values
/// refused, naming the column.
pub(super) fn prepared(name: &str, field: &Field) -> Result<Field> {
    let refuse = |problem: &str| {
        Err(Error::table(
            name,
            format!("table '{name}': column '{}' {problem}", field.name()),
        ))
    };
    let widened = match field.data_type() {
        DataType::Null => {
            return refuse("has no type (only NULLs): give it one, e.g. CAST(NULL AS DOUBLE)");
        }
        DataType::FixedSizeList(_, n) if *n <= 0 => return refuse("is a vector of no values"),
        DataType::FixedSizeList(item, _) | DataType::List(item) | DataType::LargeList(item)
            if item.data_type() == &DataType::Null =>
        {
            return refuse("is a list of no type (only NULLs): give its items one");
        }
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
        DataType::FixedSizeList(_, n) => {
            let mut metadata = field.metadata().clone();
            metadata.insert(FIXED_SIZE_KEY.to_string(), n.to_string());
            return Ok(field.clone().with_metadata(metadata));
        }
        DataType::Struct(children) => {
            let children = children
                .iter()
                .map(|c| prepared(name, c))
                .collect::<Result<Vec<Field>>>()?;
            DataType::Struct(children.into())
        }
        other => other.clone(),
    };
    Ok(field.clone().with_data_type(widened))
}

/// The Arrow schema a Delta table's scan gives (`scanned`) with each vector restored where the
/// table's schema (`delta`) keeps its length ([`FIXED_SIZE_KEY`]).
pub fn restored(scanned: &SchemaRef, delta: &StructType) -> SchemaRef {
    let fields: Vec<Field> = scanned
        .fields()
        .iter()
        .map(|f| match delta.field(f.name()) {
            Some(kept) => restore(f, kept),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        scanned.metadata().clone(),
    ))
}

pub(super) fn restore(field: &Field, kept: &deltalake_core::kernel::StructField) -> Field {
    use deltalake_core::kernel::{DataType as DeltaType, MetadataValue};
    let length = match kept.metadata().get(FIXED_SIZE_KEY) {
        Some(MetadataValue::String(n)) => n.parse::<i32>().ok(),
        Some(MetadataValue::Number(n)) => i32::try_from(*n).ok(),
        _ => None,
    };
    match (field.data_type(), kept.data_type(), length) {
        // The item named as Arrow names it (Delta's lists name theirs `element`).
        (DataType::List(item), _, Some(n)) if n > 0 => {
            let item = Field::new_list_field(item.data_type().clone(), item.is_nullable());
            field
                .clone()
                .with_data_type(DataType::FixedSizeList(Arc::new(item), n))
        }
        (DataType::Struct(children), DeltaType::Struct(inner), _) => {
            let children: Vec<Field> = children
                .iter()
                .map(|c| match inner.field(c.name()) {
                    Some(k) => restore(c, k),
                    None => c.as_ref().clone(),
                })
                .collect();
            field
                .clone()
                .with_data_type(DataType::Struct(children.into()))
        }
        _ => field.clone(),
    }
}

/// `schema` with each column's type the one a Delta table's files hold for it: the type Delta
/// reads its values as (a vector as a list, an unsigned integer as the signed one of its width, a
/// nanosecond time as microseconds, a view as a plain string), so that every reader of the table
/// finds in its files the types its log declares.
pub fn written_schema(name: &str, schema: &Schema) -> Result<SchemaRef> {
    use deltalake_core::kernel::engine::arrow_conversion::TryIntoArrow;
    let delta = delta_schema(name, schema)?;
    let fields = schema
        .fields()
        .iter()
        .zip(delta.fields())
        .map(|(field, kept)| {
            let wanted: DataType = kept.data_type().try_into_arrow().map_err(|e| {
                Error::table(
                    name,
                    format!("table '{name}': column '{}': {e}", field.name()),
                )
            })?;
            Ok(field.as_ref().clone().with_data_type(wanted))
        })
        .collect::<Result<Vec<Field>>>()?;
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// Refuses an INSERT into table `name` (columns `table`, those the statement names) of a query
/// (columns `query`) whose columns do not fit: another count, or a column whose values the
/// table's column cannot hold as they are (text into a number, a number into a narrower one, a
/// list into a scalar). Both lists of columns are named.
pub fn check_insert(name: &str, table: &[Field], query: &Schema) -> Result<()> {
    let refuse = |problem: String| {
        let table = Schema::new(table.to_vec());
        Error::table(
            name,
            format!(
                "INSERT INTO {name}: {problem}; the table has ({}), the query gives ({})",
                crate::delta::columns(&Arc::new(table)),
                crate::delta::columns(&Arc::new(query.clone()))
            ),
        )
    };
    if table.len() != query.fields().len() {
        return Err(refuse(format!(
            "the query gives {} columns for {} of the table's",
            query.fields().len(),
            table.len()
        )));
    }
    for (to, from) in table.iter().zip(query.fields()) {
        if !fits(from.data_type(), to.data_type()) {
            return Err(refuse(format!(
                "column '{}' is {}, which the table's column '{}' ({}) cannot hold as it is",
                from.name(),
                from.data_type(),
                to.name(),
                to.data_type()
            )));
        }
    }
    Ok(())
}

/// Whether values of type `from` go into a column of type `to` as they are (or widened).
pub(super) fn fits(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let int_bits = |t: &DataType| match t {
        Int8 => Some((8, true)),
        Int16 => Some((16, true)),
        Int32 => Some((32, true)),
        Int64 => Some((64, true)),
        UInt8 => Some((8, false)),
        UInt16 => Some((16, false)),
        UInt32 => Some((32, false)),
        UInt64 => Some((64, false)),
        _ => None,
    };
    let list_item = |t: &DataType| match t {
        List(f) | LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) => {
            Some(f.data_type().clone())
        }
        _ => None,
    };
    if from == to || *from == Null {
        return true;
    }
    match (from, to) {
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (Date32 | Date64, Date32 | Date64) | (Timestamp(..), Timestamp(..)) => true,
        (FixedSizeList(_, n), FixedSizeList(_, m)) if n != m => false,
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.name() == y.name() && fits(x.data_type(), y.data_type()))
        }
        _ => match (int_bits(from), int_bits(to), list_item(from), list_item(to)) {
            (Some((a, signed_a)), Some((b, signed_b)), ..) => {
                (signed_a == signed_b && a <= b) || (!signed_a && signed_b && a < b)
            }
            (Some(_), None, ..) => matches!(to, Float32 | Float64),
            (_, _, Some(a), Some(b)) => fits(&a, &b),
            _ => false,
        },
    }
}
