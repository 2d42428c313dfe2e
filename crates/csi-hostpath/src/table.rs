//! A table of the driver's state (volumes, snapshots or group snapshots by ID) that knows which
//! rows a transaction changed, so that committing one costs the rows it touched, not the size
//! of the state: the store journals just those rows, and an error puts just those back. Rows
//! are found by their CSI name, and sums over rows (a pool's used bytes, a node's published
//! volumes) are read, without a scan: both are kept for the committed rows and corrected for
//! the few rows the open transaction touched.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a table holds.
pub trait Row: Clone + PartialEq {
    /// What rows are summed by (see [`Table::total`]).
    type Tally: Clone + Eq + Hash + Debug;

    /// The name its Create* call gave the row: unique in its table, and never changed.
    fn name(&self) -> &str;

    /// What the row counts towards, and how much (nothing, unless a kind of row says).
    fn tallies(&self) -> Vec<(Self::Tally, u64)> {
        Vec::new()
    }
}

#[derive(Debug, Clone)]
pub struct Table<T: Row> {
    rows: BTreeMap<String, T>,
    /// Each row the open transaction may have changed, as it was before (`None`: absent).
    before: BTreeMap<String, Option<T>>,
    /// Name → ID of the committed rows.
    names: HashMap<String, String>,
    /// Sums over the committed rows.
    totals: HashMap<T::Tally, u64>,
}

impl<T: Row> Default for Table<T> {
    fn default() -> Self {
        Self {
            rows: BTreeMap::new(),
            before: BTreeMap::new(),
            names: HashMap::new(),
            totals: HashMap::new(),
        }
    }
}

/// Two tables are equal when their rows are: what a transaction touched is not content.
impl<T: Row> PartialEq for Table<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows
    }
}

impl<T: Row + Eq> Eq for Table<T> {}

impl<T: Row + Serialize> Serialize for Table<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.rows.serialize(serializer)
    }
}

impl<'de, T: Row + Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = Self::default();
        for (id, row) in BTreeMap::<String, T>::deserialize(deserializer)? {
            table.index(&id, &row, true);
            table.rows.insert(id, row);
        }
        Ok(table)
    }
}

/// `table[id]`: the row, or a panic naming the ID (as a map's index).
impl<T: Row, Q: ?Sized + Ord + Debug> std::ops::Index<&Q> for Table<T>
where
    String: std::borrow::Borrow<Q>,
{
    type Output = T;

    fn index(&self, id: &Q) -> &T {
        self.rows
            .get(id)
            .unwrap_or_else(|| panic!("no row {id:?} in the table"))
    }
}

impl<T: Row> Table<T> {
    pub fn get(&self, id: &str) -> Option<&T> {
        self.rows.get(id)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.rows.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.rows.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.rows.values()
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        self.remember(id);
        self.rows.get_mut(id)
    }

    /// The row named `name`, to change.
    pub fn by_name_mut(&mut self, name: &str) -> Option<&mut T> {
        let touched = self
            .before
            .keys()
            .find(|id| self.rows.get(*id).is_some_and(|row| row.name() == name));
        let id = match touched {
            Some(id) => id.clone(),
            // A committed row the transaction touched is found above, if it still has the name.
            None => self
                .names
                .get(name)
                .filter(|id| !self.before.contains_key(*id))?
                .clone(),
        };
        self.get_mut(&id)
    }

    /// The sum of what the rows count towards `tally`, as of now.
    pub fn total(&self, tally: &T::Tally) -> u64 {
        let committed = self.totals.get(tally).copied().unwrap_or(0);
        let of = |row: Option<&T>| -> u64 {
            row.map_or(0, |row| {
                row.tallies()
                    .into_iter()
                    .filter(|(t, _)| t == tally)
                    .map(|(_, amount)| amount)
                    .sum()
            })
        };
        self.before.iter().fold(committed, |sum, (id, before)| {
            (sum + of(self.rows.get(id))).saturating_sub(of(before.as_ref()))
        })
    }

    pub fn insert(&mut self, id: String, row: T) -> Option<T> {
        self.remember(&id);
        self.rows.insert(id, row)
    }

    pub fn remove(&mut self, id: &str) -> Option<T> {
        self.remember(id);
        self.rows.remove(id)
    }

    /// Every row, to change: the transaction then costs the whole table (recovery only).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        for (id, row) in &self.rows {
            self.before
                .entry(id.clone())
                .or_insert_with(|| Some(row.clone()));
        }
        self.rows.values_mut()
    }

    fn remember(&mut self, id: &str) {
        if !self.before.contains_key(id) {
            self.before
                .insert(id.to_string(), self.rows.get(id).cloned());
        }
    }

    /// Adds (or takes away) a committed row's name and tallies.
    fn index(&mut self, id: &str, row: &T, add: bool) {
        if add {
            self.names.insert(row.name().to_string(), id.to_string());
        } else if self.names.get(row.name()).is_some_and(|named| named == id) {
            self.names.remove(row.name());
        }
        for (tally, amount) in row.tallies() {
            let total = self.totals.entry(tally.clone()).or_default();
            *total = if add {
                total.saturating_add(amount)
            } else {
                total.saturating_sub(amount)
            };
            if *total == 0 {
                self.totals.remove(&tally);
            }
        }
    }

    /// Ends the open transaction, keeping its changes: the rows that differ from before it,
    /// with their new content (`None`: removed).
    pub(crate) fn commit(&mut self) -> BTreeMap<String, Option<T>> {
        let mut changed = BTreeMap::new();
        for (id, before) in std::mem::take(&mut self.before) {
            let now = self.rows.get(&id).cloned();
            if now == before {
                continue;
            }
            if let Some(before) = &before {
                self.index(&id, before, false);
            }
            if let Some(now) = &now {
                self.index(&id, now, true);
            }
            changed.insert(id, now);
        }
        changed
    }

    /// Ends the open transaction, putting every row it touched back as it was.
    pub(crate) fn roll_back(&mut self) {
        for (id, before) in std::mem::take(&mut self.before) {
            match before {
                Some(row) => self.rows.insert(id, row),
                None => self.rows.remove(&id),
            };
        }
    }

    /// Applies changes committed elsewhere (a journal entry), outside any transaction.
    pub(crate) fn apply(&mut self, changes: BTreeMap<String, Option<T>>) {
        for (id, row) in changes {
            let old = match row {
                Some(row) => {
                    self.index(&id, &row, true);
                    self.rows.insert(id.clone(), row)
                }
                None => self.rows.remove(&id),
            };
            if let Some(old) = old {
                self.index(&id, &old, false);
                // Taking the old row away may have dropped the new row's name (the same one).
                if let Some(row) = self.rows.get(&id) {
                    self.names.insert(row.name().to_string(), id.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row named `n-<id>` with a value.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Row {
        name: String,
        value: u32,
    }

    impl super::Row for Row {
        type Tally = &'static str;

        fn name(&self) -> &str {
            &self.name
        }

        /// Every row counts its value towards "all", and 1 towards "odd" if its value is odd.
        fn tallies(&self) -> Vec<(&'static str, u64)> {
            let mut tallies = vec![("all", u64::from(self.value))];
            if self.value % 2 == 1 {
                tallies.push(("odd", 1));
            }
            tallies
        }
    }

    fn row(id: &str, value: u32) -> Row {
        Row {
            name: format!("n-{id}"),
            value,
        }
    }

    fn table(rows: &[(&str, u32)]) -> Table<Row> {
        let mut table = Table::default();
        table.apply(
            rows.iter()
                .map(|(id, value)| (id.to_string(), Some(row(id, *value))))
                .collect(),
        );
        table
    }

    /// A case: its name, what the transaction does, and what it commits.
    type Case = (
        &'static str,
        fn(&mut Table<Row>),
        &'static [(&'static str, Option<u32>)],
    );

    #[test]
    fn a_commit_names_only_the_rows_that_changed() {
        let cases: &[Case] = &[
            ("nothing", |_| {}, &[]),
            (
                "read only",
                |t| assert_eq!(t.get("a").unwrap().value, 1),
                &[],
            ),
            (
                "changed",
                |t| t.get_mut("a").unwrap().value = 5,
                &[("a", Some(5))],
            ),
            (
                "touched, same value",
                |t| t.get_mut("a").unwrap().value = 1,
                &[],
            ),
            (
                "inserted",
                |t| _ = t.insert("c".into(), row("c", 3)),
                &[("c", Some(3))],
            ),
            ("removed", |t| _ = t.remove("b"), &[("b", None)]),
            (
                "removed and put back",
                |t| {
                    t.remove("b");
                    t.insert("b".into(), row("b", 2));
                },
                &[],
            ),
            (
                "missing row asked for",
                |t| assert!(t.get_mut("z").is_none()),
                &[],
            ),
            (
                "found by name",
                |t| t.by_name_mut("n-b").unwrap().value = 9,
                &[("b", Some(9))],
            ),
            (
                "no such name",
                |t| assert!(t.by_name_mut("b").is_none()),
                &[],
            ),
            (
                "every row",
                |t| t.values_mut().for_each(|r| r.value += 1),
                &[("a", Some(2)), ("b", Some(3))],
            ),
        ];
        for (name, change, expected) in cases {
            let mut t = table(&[("a", 1), ("b", 2)]);
            change(&mut t);
            let committed: BTreeMap<String, Option<u32>> = t
                .commit()
                .into_iter()
                .map(|(id, row)| (id, row.map(|r| r.value)))
                .collect();
            let expected: BTreeMap<String, Option<u32>> = expected
                .iter()
                .map(|(id, v)| (id.to_string(), *v))
                .collect();
            assert_eq!(committed, expected, "{name}");
            assert!(
                t.commit().is_empty(),
                "{name}: a commit ends the transaction"
            );
        }
    }

    #[test]
    fn a_roll_back_restores_every_touched_row() {
        let mut t = table(&[("a", 1), ("b", 2)]);
        t.get_mut("a").unwrap().value = 7;
        t.remove("b");
        t.insert("c".into(), row("c", 3));
        t.values_mut().for_each(|r| r.value = 0);
        t.roll_back();
        assert_eq!(t, table(&[("a", 1), ("b", 2)]));
        assert!(t.commit().is_empty());
        assert!(
            t.by_name_mut("n-c").is_none(),
            "the inserted row's name is gone"
        );
        assert_eq!(
            t.by_name_mut("n-b").unwrap().value,
            2,
            "the removed row's name is back"
        );
    }

    #[test]
    fn names_follow_inserts_removals_and_applied_changes() {
        let mut t = table(&[("a", 1)]);
        t.remove("a");
        assert!(t.by_name_mut("n-a").is_none(), "removed, not committed");
        t.commit();
        assert!(t.by_name_mut("n-a").is_none());
        t.insert("c".into(), row("c", 3));
        assert_eq!(
            t.by_name_mut("n-c").unwrap().value,
            3,
            "inserted, not committed"
        );
        t.roll_back();
        assert!(t.by_name_mut("n-c").is_none());
        t.apply([("b".to_string(), Some(row("b", 2)))].into());
        assert_eq!(t.by_name_mut("n-b").unwrap().value, 2);
        t.commit();
        t.apply([("b".to_string(), Some(row("b", 4)))].into());
        assert_eq!(
            t.by_name_mut("n-b").unwrap().value,
            4,
            "replaced, same name"
        );
        t.commit();
        t.apply([("b".to_string(), None)].into());
        assert!(t.by_name_mut("n-b").is_none());
    }

    #[test]
    fn totals_are_of_the_rows_as_they_are_now() {
        let mut t = table(&[("a", 1), ("b", 2)]);
        let totals = |t: &Table<Row>| (t.total(&"all"), t.total(&"odd"));
        assert_eq!(totals(&t), (3, 1));
        t.get_mut("a").unwrap().value = 4;
        assert_eq!(totals(&t), (6, 0), "changed in place, not committed");
        t.insert("c".into(), row("c", 5));
        assert_eq!(totals(&t), (11, 1));
        t.remove("b");
        assert_eq!(totals(&t), (9, 1));
        t.roll_back();
        assert_eq!(totals(&t), (3, 1), "rolled back");
        t.get_mut("b").unwrap().value = 7;
        t.commit();
        assert_eq!(totals(&t), (8, 2), "committed");
        t.apply(
            [
                ("a".to_string(), None),
                ("d".to_string(), Some(row("d", 10))),
            ]
            .into(),
        );
        assert_eq!(totals(&t), (17, 1), "applied");
        let read: Table<Row> = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(totals(&read), (17, 1), "read");
    }

    #[test]
    fn serialized_as_a_plain_map_and_indexed_when_read() {
        let t = table(&[("a", 1)]);
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"a":{"name":"n-a","value":1}}"#);
        let mut read: Table<Row> = serde_json::from_str(&text).unwrap();
        assert_eq!(read, t);
        assert_eq!(read[&"a".to_string()].value, 1);
        assert_eq!(read.by_name_mut("n-a").unwrap().value, 1);
    }
}
