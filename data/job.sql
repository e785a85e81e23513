-- The sample job: score every bundled feature row with the linear model and classify the iris
-- flowers, keeping both as Parquet under out/, then summarise what was written.
COPY (
  SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score
  FROM 'data/sample/features.parquet'
) TO 'out/scores.parquet' STORED AS PARQUET;

COPY (
  SELECT id, species, predict('iris', sepal_length, sepal_width, petal_length, petal_width) AS prediction
  FROM 'data/sample/iris.parquet'
) TO 'out/iris.parquet' STORED AS PARQUET;

SELECT count(*) AS rows, min(score) AS min_score, avg(score) AS mean_score, max(score) AS max_score
FROM 'out/scores.parquet';

SELECT species, prediction['label'] AS predicted_label, count(*) AS flowers
FROM 'out/iris.parquet' GROUP BY species, prediction['label'] ORDER BY species, predicted_label;
